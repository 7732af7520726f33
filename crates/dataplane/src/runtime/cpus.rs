//! CPUs for per-queue workers: one each, from the CPUs natrix may run on,
//! so that a worker and the queues it serves stay on one CPU (an operator
//! points each queue's interrupt at its worker's CPU). Which CPUs natrix
//! may use is the operator's to choose, as for any process: `taskset`,
//! systemd's `CPUAffinity=`, or a cpuset.

use std::mem::{size_of, zeroed};
use std::os::unix::thread::JoinHandleExt;
use std::thread::JoinHandle;

/// The first `count` CPUs this process may run on, or None where it may
/// run on fewer (workers then share CPUs as the scheduler sees fit).
pub(super) fn one_each(count: usize) -> Option<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: set is live and sized for the call; 0 is this thread.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads the set within its size.
    let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).take(count).collect();
    (allowed.len() == count).then_some(allowed)
}

/// Keeps `thread` on `cpu`; an error where the kernel refused (a CPU
/// taken offline since), and the thread stays where it was.
pub(super) fn pin<T>(thread: &JoinHandle<T>, cpu: usize) -> std::io::Result<()> {
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: cpu is below CPU_SETSIZE: it came from one_each.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the handle's thread has not been joined, so its pthread_t is
    // live; set is sized for the call.
    match unsafe { libc::pthread_setaffinity_np(thread.as_pthread_t(), size_of::<libc::cpu_set_t>(), &set) } {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_each_gives_distinct_cpus_and_none_past_what_there_is() {
        let all = one_each(1).expect("the process may run on some CPU");
        assert_eq!(all.len(), 1);
        let available = std::thread::available_parallelism().map_or(1, usize::from);
        if let Some(cpus) = one_each(available) {
            assert!(cpus.windows(2).all(|w| w[0] < w[1]), "distinct, in order: {cpus:?}");
        }
        assert_eq!(one_each(libc::CPU_SETSIZE as usize + 1), None);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || rx.recv());
        pin(&thread, all[0]).expect("a thread may be pinned to an allowed CPU");
        assert!(pin(&thread, libc::CPU_SETSIZE as usize - 1).is_err(), "a CPU the machine lacks is refused");
        tx.send(()).unwrap();
        thread.join().unwrap().unwrap();
    }
}
