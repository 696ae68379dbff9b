//! What `stoker bench coordinator-grpc` reads to report a way: a process's CPU time, the
//! loopback interface's byte count, and quantiles of sorted latencies.

use super::{Error, Result};

/// CPU seconds (user + system) process `pid` has used, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| Error::Failed(format!("unreadable /proc/{pid}/stat")))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let (Some(user), Some(system)) = (ticks(11), ticks(12)) else {
        return Err(Error::Failed(format!("unreadable /proc/{pid}/stat")));
    };
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((user + system) as f64 / per_second)
}

/// The value at fraction `q` of `sorted`.
pub fn quantile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    f64::from(sorted[at.min(sorted.len() - 1)])
}

/// Bytes sent on the loopback interface so far (each byte between two local sockets once),
/// from `/proc/net/dev`.
pub fn loopback_bytes() -> Result<u64> {
    let table = std::fs::read_to_string("/proc/net/dev")?;
    table
        .lines()
        .find_map(|line| {
            let (name, counters) = line.split_once(':')?;
            (name.trim() == "lo").then_some(counters)
        })
        .and_then(|counters| counters.split_whitespace().nth(8)?.parse().ok())
        .ok_or_else(|| Error::Failed("no loopback interface in /proc/net/dev".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_sorted_latencies() {
        let sorted: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&sorted, 0.5), 51.0);
        assert_eq!(quantile(&sorted, 0.99), 99.0);
        assert_eq!(quantile(&[], 0.99), 0.0);
    }

    #[test]
    fn the_loopback_interface_counts_bytes() {
        let before = loopback_bytes().expect("a loopback interface");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bound");
        let mut sender =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connected");
        let (mut receiver, _) = listener.accept().expect("accepted");
        std::io::Write::write_all(&mut sender, &[7u8; 100_000]).expect("sent");
        let mut got = vec![0u8; 100_000];
        std::io::Read::read_exact(&mut receiver, &mut got).expect("received");
        assert!(loopback_bytes().expect("counted") >= before + 100_000);
    }
}
