//! CPU time as the tester charges it: a process's, a set of CPUs' busy
//! time, the machine's.

fn ticks_to_ns(ticks: u64) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000_000 / hz
}

/// User and system time of a process and all its threads.
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(ticks_to_ns(utime + stime))
}

/// Softirq time of all CPUs together: the seventh value of /proc/stat's
/// `cpu` line.
pub fn softirq_ns() -> Option<u64> {
    let stat = read_stat()?;
    let all = stat.lines().find(|l| l.split_whitespace().next() == Some("cpu"))?;
    Some(ticks_to_ns(all.split_whitespace().nth(7)?.parse().ok()?))
}

fn read_stat() -> Option<String> {
    std::fs::read_to_string("/proc/stat").ok()
}

/// Busy time of all CPUs together.
pub fn machine_busy_ns() -> Option<u64> {
    Some(each_cpu_busy_ns()?.busy.iter().flatten().sum())
}

/// Every CPU's busy time (as `cpu_busy_ns` counts it) from one read of
/// /proc/stat, by CPU number (None for a number /proc/stat skips: an
/// offline CPU), and when it was read.
pub struct EachCpu {
    pub at_ns: u64,
    pub busy: Vec<Option<u64>>,
}

pub fn each_cpu_busy_ns() -> Option<EachCpu> {
    let at_ns = monotonic_ns();
    let mut busy = Vec::new();
    for line in read_stat()?.lines() {
        let mut fields = line.split_whitespace();
        let Some(cpu) = fields.next().and_then(|n| n.strip_prefix("cpu")).and_then(|n| n.parse::<usize>().ok()) else { continue };
        let values: Vec<u64> = fields.map(|x| x.parse().unwrap_or(0)).collect();
        if busy.len() <= cpu {
            busy.resize(cpu + 1, None);
        }
        busy[cpu] = Some(cpu_line_busy_ns(&values, at_ns)?);
    }
    (!busy.is_empty()).then_some(EachCpu { at_ns, busy })
}

/// Busy time of CPUs `cpus` together (/proc/stat's `cpuN` lines), as a
/// counter whose differences count: the monotonic clock (on which the
/// kernel keeps idle time) less what each CPU spent idle, waiting for I/O
/// or stolen by the hypervisor. None where one of them is not there.
///
/// Not the sum of the busy columns: those are sampled by the scheduler
/// tick, which a tickless idle CPU has stopped, so softirq work run on such
/// a CPU on an interrupt's way out (the kernel's forwarding, raised there
/// by RPS) is in no column at all. A 2-CPU VM forwarding TCP for the
/// kernel showed its CPU 4% busy by the columns and 50% not idle. Idle
/// time is measured exactly whether the tick runs or not.
pub fn cpu_busy_ns(cpus: &[usize]) -> Option<u64> {
    let each = each_cpu_busy_ns()?;
    cpus.iter().map(|&c| each.busy.get(c).copied().flatten()).sum()
}

/// One CPU's busy time from its /proc/stat values (user, nice, system,
/// idle, iowait, irq, softirq, steal, ...) and the monotonic clock.
fn cpu_line_busy_ns(values: &[u64], monotonic_ns: u64) -> Option<u64> {
    let away = values.get(3)? + values.get(4)? + values.get(7)?;
    Some(monotonic_ns.saturating_sub(ticks_to_ns(away)))
}

/// A thread's CPU time so far (schedstat's, else /proc/stat's ticks),
/// the time it waited to run, and the CPU it last ran on.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadTime {
    pub tid: u32,
    pub name: String,
    pub cpu_ns: u64,
    /// Runnable but not running (schedstat's second field): behind
    /// another thread on its CPU. None where the kernel keeps no schedstat.
    pub wait_ns: Option<u64>,
    pub last_cpu: u32,
}

/// Every thread on the machine whose name starts with one of `prefixes`
/// (the kernel's NAPI threads, natrix's workers), read from /proc; threads
/// that end while it reads are left out.
pub fn threads_named(prefixes: &[&str]) -> Vec<ThreadTime> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    let tasks = procs.flatten().filter(|p| p.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())));
    let mut found = Vec::new();
    for proc_dir in tasks {
        let Ok(threads) = std::fs::read_dir(proc_dir.path().join("task")) else { continue };
        for thread in threads.flatten() {
            let Ok(stat) = std::fs::read_to_string(thread.path().join("stat")) else { continue };
            if let Some(mut t) = parse_thread_stat(&stat).filter(|t| prefixes.iter().any(|p| t.name.starts_with(p))) {
                if let Some((run_ns, wait_ns)) = std::fs::read_to_string(thread.path().join("schedstat")).ok().and_then(|s| parse_schedstat(&s)) {
                    (t.cpu_ns, t.wait_ns) = (run_ns, Some(wait_ns));
                }
                found.push(t);
            }
        }
    }
    found
}

/// A thread's /proc stat line: its id, name (in parentheses, which may
/// hold spaces and parentheses), user and system time, last CPU (field 39).
fn parse_thread_stat(stat: &str) -> Option<ThreadTime> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let tid = stat[..open].trim().parse().ok()?;
    let name = stat.get(open + 1..close)?.to_owned();
    let f: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ThreadTime { tid, name, cpu_ns: ticks_to_ns(ticks), wait_ns: None, last_cpu: f.get(36)?.parse().ok()? })
}

/// The time on a CPU and waiting on a run queue, from a schedstat line
/// (run time, wait time, time slices; nanoseconds, where /proc/stat has
/// 10 ms ticks). None where the kernel collects none (all zeroes: a
/// thread that ran has run time).
fn parse_schedstat(schedstat: &str) -> Option<(u64, u64)> {
    let mut f = schedstat.split_whitespace().map(|x| x.parse::<u64>().ok());
    let (run, wait) = (f.next()??, f.next()??);
    (run != 0).then_some((run, wait))
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn this_process_and_the_machine_have_cpu_time() {
        assert!(process_cpu_ns(std::process::id()).is_some());
        assert!(machine_busy_ns().is_some_and(|ns| ns > 0));
        assert!(softirq_ns().is_some() && cpu_busy_ns(&[0]).is_some_and(|ns| ns > 0));
        assert_eq!(cpu_busy_ns(&[0, 999_999]), None);
    }

    #[test]
    fn a_thread_stat_line_gives_its_name_time_and_last_cpu() {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        // proc(5): utime and stime are fields 14 and 15, processor 39.
        let mut fields: Vec<String> = (3..=52).map(|n| format!("{}", n * 1000)).collect();
        fields[14 - 3] = hz.to_string();
        fields[15 - 3] = (hz / 2).to_string();
        fields[39 - 3] = "7".into();
        let line = format!("4242 (napi/in (x)-8) {}", fields.join(" "));
        let t = parse_thread_stat(&line).unwrap();
        assert_eq!(t, ThreadTime { tid: 4242, name: "napi/in (x)-8".into(), cpu_ns: 1_500_000_000, wait_ns: None, last_cpu: 7 });
        assert_eq!(parse_thread_stat("4242 (short) S 1 2"), None);
        assert_eq!(parse_schedstat("123456 7890 12\n"), Some((123456, 7890)));
        assert_eq!(parse_schedstat("123456\n"), None);
        assert_eq!(parse_schedstat("0 0 0\n"), None, "not collected");
    }

    #[test]
    fn this_thread_is_found_by_its_name() {
        // The process id in the name: another copy of this test may run.
        let name = format!("nx-ct-{}", std::process::id());
        let found = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() } as u32;
                threads_named(&[&name]).into_iter().map(|t| t.tid).collect::<Vec<_>>() == vec![tid]
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(found);
    }

    #[test]
    fn a_cpu_is_busy_whenever_it_is_not_idle_whatever_its_busy_columns_say() {
        // 1 s on the clock; the columns show 0.05 s of softirq, 0.5 s idle,
        // 0.1 s I/O wait and 0.1 s stolen: the other 0.25 s ran unsampled.
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        let v = [0, 0, 0, hz / 2, hz / 10, 0, hz / 20, hz / 10];
        assert_eq!(cpu_line_busy_ns(&v, 1_000_000_000), Some(300_000_000));
        assert_eq!(cpu_line_busy_ns(&v[..5], 1_000_000_000), None);
    }

    #[test]
    fn a_spinning_thread_makes_its_cpu_busy() {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap();
        let set = super::super::lab::cpu_set(&[cpu]);
        // SAFETY: set is a live cpu_set_t of the size given; 0 is this thread.
        assert_eq!(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) }, 0);
        let started = Instant::now();
        let before = cpu_busy_ns(&[cpu]).unwrap();
        while started.elapsed() < Duration::from_millis(300) {
            std::hint::spin_loop();
        }
        let spun = cpu_busy_ns(&[cpu]).unwrap() - before;
        let elapsed = started.elapsed().as_nanos() as u64;
        // Busy all along, whoever ran (idle never), to the idle count's
        // 10 ms ticks; only stolen time is subtracted.
        assert!(spun >= 200_000_000 && spun <= elapsed + 20_000_000, "{spun} ns busy in {elapsed} ns");
    }
}
