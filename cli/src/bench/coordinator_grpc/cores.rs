//! `--coordinator-cores N`: the coordinator processes on cores of their own (the first N this
//! process may use) and the simulators on the others, as a deployment gives a coordinator its
//! cores, so the figure per coordinator core-second is not the cost of sharing each core with
//! the load that drives it. Linux affinity (`sched_setaffinity`), set on every thread a process
//! has; threads made later inherit it from the thread that makes them.

use serde::Serialize;

use super::{Error, Result};

/// Where the coordinators and the simulators run.
#[derive(Debug, Clone, Serialize)]
pub struct Placement {
    /// The cores this process could use when the bench started.
    pub machine_cores: usize,
    /// The coordinators' cores, of their own (empty: every core shared with the simulators).
    pub coordinator_cores: Vec<usize>,
    /// The simulators' cores (empty: every core).
    pub simulator_cores: Vec<usize>,
}

impl Placement {
    /// With `count` above 0, the first `count` cores this process may use for the coordinators
    /// and the rest for this process, pinned to them now (its threads made later inherit
    /// them); with 0, every core shared.
    pub fn take(count: usize) -> Result<Placement> {
        let cores = allowed()?;
        let machine_cores = cores.len();
        if count == 0 {
            return Ok(Placement {
                machine_cores,
                coordinator_cores: Vec::new(),
                simulator_cores: Vec::new(),
            });
        }
        let (coordinator_cores, simulator_cores) = split(&cores, count)?;
        pin(0, &simulator_cores)?;
        Ok(Placement {
            machine_cores,
            coordinator_cores,
            simulator_cores,
        })
    }

    /// Keeps a coordinator process on the coordinators' cores (nothing when they are shared).
    pub fn place_coordinator(&self, pid: u32) -> Result<()> {
        match self.coordinator_cores.is_empty() {
            true => Ok(()),
            false => pin(pid, &self.coordinator_cores),
        }
    }

    /// Where they run, in words.
    pub fn describe(&self) -> String {
        match self.coordinator_cores.is_empty() {
            true => format!(
                "{} cores on this machine, shared with the simulators",
                self.machine_cores
            ),
            false => format!(
                "{} cores on this machine: the coordinators on cores {:?} of their own, the \
                 simulators on {:?}",
                self.machine_cores, self.coordinator_cores, self.simulator_cores
            ),
        }
    }
}

/// The cores this process may run on, in order.
pub fn allowed() -> Result<Vec<usize>> {
    // SAFETY: a zeroed set is a valid empty set, filled by the call for this thread.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the size and pointer are the local set's.
    let status = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if status != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let cores = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `core` is below the set's size.
        .filter(|&core| unsafe { libc::CPU_ISSET(core, &set) })
        .collect();
    Ok(cores)
}

/// `cores` split into the first `count` (the coordinators') and the rest (the simulators'),
/// each side with at least one.
pub fn split(cores: &[usize], count: usize) -> Result<(Vec<usize>, Vec<usize>)> {
    if count == 0 || count >= cores.len() {
        return Err(Error::InvalidArgument(format!(
            "--coordinator-cores must leave the simulators a core: 1..={} here ({} cores)",
            cores.len().saturating_sub(1),
            cores.len()
        )));
    }
    Ok((cores[..count].to_vec(), cores[count..].to_vec()))
}

/// Keeps every thread of process `pid` (0: this one) on `cores`.
pub fn pin(pid: u32, cores: &[usize]) -> Result<()> {
    // SAFETY: a zeroed set is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &core in cores {
        // SAFETY: the set is a local one; CPU_SET ignores cores past its size.
        unsafe { libc::CPU_SET(core, &mut set) };
    }
    let tasks = match pid {
        0 => "/proc/self/task".to_string(),
        pid => format!("/proc/{pid}/task"),
    };
    for entry in std::fs::read_dir(tasks)? {
        let Some(tid) = entry?.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        // SAFETY: the size and pointer are the local set's; a thread gone meanwhile fails the
        // call, which is ignored below.
        let status = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
        if status != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::ESRCH) {
                return Err(Error::Failed(format!(
                    "cannot pin thread {tid} to {cores:?}: {error}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coordinators_take_the_first_cores_and_leave_the_simulators_one() {
        let cores = [0, 1, 2, 5];
        assert_eq!(split(&cores, 1).unwrap(), (vec![0], vec![1, 2, 5]));
        assert_eq!(split(&cores, 3).unwrap(), (vec![0, 1, 2], vec![5]));
        for count in [0, 4, 9] {
            let error = split(&cores, count).unwrap_err().to_string();
            assert!(error.contains("1..=3 here (4 cores)"), "{error}");
        }
    }

    #[test]
    fn a_process_pinned_to_one_core_runs_every_thread_there() {
        let cores = allowed().unwrap();
        assert!(!cores.is_empty());
        // A child of its own, so this test binary keeps its cores.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let last = *cores.last().unwrap();
        pin(child.id(), &[last]).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let listed = status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
            .map(str::trim)
            .unwrap()
            .to_string();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(listed, last.to_string());
    }
}
