//! The few system calls the tester needs beyond its ports: the clock,
//! sleeping on the ports until a deadline, CPU placement, and entering a
//! network namespace to open a port there.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// CLOCK_MONOTONIC in nanoseconds: one clock for both ends of a trial,
/// since the tester sends and receives in one process.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps until one of `fds` is readable or `timeout_ns` passes; reads
/// the error of a socket poll reports one for (`take_socket_error`).
pub fn wait_readable(fds: &[RawFd], timeout_ns: u64) {
    let mut polls: Vec<libc::pollfd> = fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ts = libc::timespec { tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t, tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long };
    // SAFETY: polls and ts are live for the call; a null sigmask keeps the
    // thread's own. An interrupted or failed wait only ends the nap early.
    unsafe { libc::ppoll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, &ts, std::ptr::null()) };
    for p in polls.iter().filter(|p| p.revents & libc::POLLERR != 0) {
        natrix_io::take_socket_error(p.fd);
    }
}

/// Timer wake-ups as exact as the kernel can make them: the default 50 us
/// of slack would show up in every paced frame's timing.
pub fn exact_timers() {
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
}

/// Keeps the calling thread on `cpu`, when the machine has it.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays inside it for cpu < CPU_SETSIZE.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// CFS weight for the tester's thread (and the device's process) over the
/// ordinary work of a shared machine: nice -10 gets about ten times the
/// CPU share of a nice 0 task competing for the same CPU.
pub const NICE: i32 = -10;

/// Gives the calling thread `NICE`; a failure (no CAP_SYS_NICE) leaves
/// it as it was.
pub fn raise_priority() -> io::Result<()> {
    // SAFETY: gettid has no preconditions; setpriority on one's own thread
    // id changes only this thread's nice value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, NICE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Runs `f` with the calling thread inside the network namespace that
/// `ip netns` calls `name`, then returns to the namespace it was in.
/// Sockets opened in `f` stay in `name`'s namespace for their lifetime.
pub fn in_netns<T>(name: &str, f: impl FnOnce() -> T) -> io::Result<T> {
    let home = File::open("/proc/thread-self/ns/net")?;
    let target = File::open(format!("/run/netns/{name}"))?;
    set_netns(target.as_raw_fd())?;
    let out = f();
    set_netns(home.as_raw_fd()).map(|()| out)
}

fn set_netns(fd: RawFd) -> io::Result<()> {
    // SAFETY: fd is an open namespace file; setns only changes this thread.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a && a > 0);
    }

    #[test]
    fn a_missing_namespace_is_an_error_not_a_move() {
        let before = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        assert!(in_netns("nx-no-such-namespace", || ()).is_err());
        assert_eq!(std::fs::read_link("/proc/thread-self/ns/net").unwrap(), before);
    }
}
