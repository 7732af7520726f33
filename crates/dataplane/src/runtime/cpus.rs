//! CPUs for per-queue workers: one each, from the CPUs natrix may run on,
//! so that a worker and the queues it serves stay on one CPU (an operator
//! points each queue's interrupt at its worker's CPU).

use std::mem::{size_of, zeroed};

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

/// Keeps the calling thread on `cpu`; best effort (a CPU taken offline
/// since leaves the thread where it was).
pub(super) fn pin_this_thread(cpu: usize) {
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: cpu is below CPU_SETSIZE: it came from one_each.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: set is live and sized for the call; 0 is this thread.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
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
    }
}
