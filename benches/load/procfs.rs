//! What Linux's /proc says about the machine and the processes under test: CPU time, memory,
//! cores and their pinning. Absent elsewhere: every reading is an `Option`.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// USER_HZ: the unit of the tick counters in /proc (100 on every Linux that matters).
const TICK: Duration = Duration::from_millis(10);

/// The CPUs this process may run on, from `Cpus_allowed_list` (e.g. `0-1,4`).
pub fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(list) = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")) else {
        return Vec::new();
    };
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(first), Ok(last)) = (first.trim().parse::<usize>(), last.trim().parse::<usize>()) {
            cpus.extend(first..=last);
        }
    }
    cpus
}

/// Pins every thread of this process (and so every thread it starts later) to `cpu`, with
/// `taskset`, which keeps the bench free of `unsafe`.
pub fn pin_self(cpu: usize) -> Result<(), String> {
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run taskset: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("taskset failed: {status}")) }
}

/// Sets this process's nice value (on Linux, of its only thread so far; threads and children
/// started later inherit it), with `renice`; returns the value now in force.
pub fn renice_self(nice: i32) -> Result<i32, String> {
    let status = Command::new("renice")
        .args(["-n", &nice.to_string(), "-p", &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run renice: {e}"))?;
    let now = own_nice().ok_or("cannot read this process's nice value")?;
    if status.success() && now == nice { Ok(now) } else { Err(format!("renice to {nice} refused; nice is {now}")) }
}

/// Sets the nice value of this process's scheduler autogroup, but only when its session was
/// started for this run (its leader is our parent, as `scripts/bench-load` arranges): with
/// autogroups, nice values only count inside a session's group, and every other session is a
/// group of its own. Returns what happened, for the report.
pub fn renice_own_autogroup(nice: i32) -> String {
    let Ok(before) = std::fs::read_to_string("/proc/self/autogroup") else {
        return "no autogroups".into();
    };
    let enabled = std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled").is_ok_and(|v| v.trim() == "1");
    if !enabled {
        return "autogroups off".into();
    }
    let session_for_this_run = stat_fields("self")
        .and_then(|f| Some(f.get(3)?.parse::<u32>().ok()? == f.get(1)?.parse::<u32>().ok()?))
        .unwrap_or(false);
    if !session_for_this_run {
        return format!(
            "autogroup shared with the caller's session, left at {} (run scripts/bench-load to raise it)",
            before.trim().rsplit(' ').next().unwrap_or("?")
        );
    }
    match std::fs::write("/proc/self/autogroup", nice.to_string()) {
        Ok(()) => format!("autogroup of its own session at nice {nice}"),
        Err(error) => format!("autogroup nice unchanged ({error})"),
    }
}

/// This process's nice value, from /proc/self/stat.
pub fn own_nice() -> Option<i32> {
    stat_fields("self")?.get(16)?.parse().ok()
}

/// Whether this process runs as root (and so may raise its priority).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Uid:")).map(|uids| uids.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// A process and all its descendants (nginx's master and worker), found through the parent
/// pid of every process in /proc.
pub fn process_tree(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if let Some(ppid) = stat_fields(&pid.to_string()).and_then(|f| f.get(1)?.parse::<u32>().ok()) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut tree = vec![root];
    let mut at = 0;
    while at < tree.len() {
        if let Some(kids) = children.get(&tree[at]) {
            tree.extend(kids);
        }
        at += 1;
    }
    tree
}

/// The fields of /proc/PID/stat after the parenthesised command name: index 0 is the state,
/// 1 the parent pid, 11 and 12 utime and stime.
fn stat_fields(pid: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// utime + stime of a process (all its threads, living or exited), in ticks.
fn process_ticks(pid: &str) -> Option<u64> {
    let fields = stat_fields(pid)?;
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// CPU time of a process tree at one moment: per thread in nanoseconds (precise, from
/// schedstat) and per process in ticks (10 ms steps, but it keeps exited threads).
pub struct TreeCpu {
    threads: HashMap<(u32, u32), u64>,
    ticks: u64,
}

impl TreeCpu {
    pub fn now(root: u32) -> Self {
        let mut threads = HashMap::new();
        let mut ticks = 0;
        for pid in process_tree(root) {
            ticks += process_ticks(&pid.to_string()).unwrap_or(0);
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
            for task in tasks.flatten() {
                let Some(tid) = task.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
                let schedstat =
                    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).unwrap_or_default();
                if let Some(ns) = schedstat.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()) {
                    threads.insert((pid, tid), ns);
                }
            }
        }
        Self { threads, ticks }
    }

    /// CPU time used since `before`, and whether it is nanosecond-precise: it is when every
    /// thread seen then is still there, else (a thread exited and took its counter along) it
    /// comes from the tick counters.
    pub fn since(&self, before: &TreeCpu) -> (Duration, bool) {
        let all_alive = before.threads.keys().all(|key| self.threads.contains_key(key));
        if all_alive && !self.threads.is_empty() {
            let ns: u64 = self
                .threads
                .iter()
                .map(|(key, ns)| ns.saturating_sub(before.threads.get(key).copied().unwrap_or(0)))
                .sum();
            (Duration::from_nanos(ns), true)
        } else {
            (TICK * u32::try_from(self.ticks.saturating_sub(before.ticks)).unwrap_or(u32::MAX), false)
        }
    }

    pub fn ticks(&self) -> u64 {
        self.ticks
    }
}

/// Resident memory of a process tree in KiB: now (VmRSS) and at its peak (VmHWM), summed over
/// the tree (pages shared between nginx's master and worker count twice).
#[derive(Clone, Copy, Default)]
pub struct Memory {
    pub rss_kib: u64,
    pub peak_kib: u64,
}

impl Memory {
    pub fn of_tree(root: u32) -> Option<Self> {
        let mut memory = Self::default();
        let mut seen = false;
        for pid in process_tree(root) {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            };
            memory.rss_kib += field("VmRSS:").unwrap_or(0);
            memory.peak_kib += field("VmHWM:").unwrap_or(0);
            seen = true;
        }
        seen.then_some(memory)
    }

    pub fn max(self, other: Self) -> Self {
        Self { rss_kib: self.rss_kib.max(other.rss_kib), peak_kib: self.peak_kib.max(other.peak_kib) }
    }
}

/// Busy time of the whole machine, to tell a run disturbed by other work (a build next door).
pub struct Machine {
    at: Instant,
    /// Non-idle ticks of all CPUs.
    busy: u64,
    /// irq + softirq ticks: mostly loopback TCP, charged to no process.
    irq: u64,
    /// This process: load generator, pacer and stub.
    bench: u64,
}

/// Where the CPU time of a measured window went, in percent of one core.
pub struct CpuShare {
    pub bench: f64,
    pub proxy: f64,
    pub irq: f64,
    /// Everything else: other processes. A lower bound, since irq time already counted in a
    /// process's time is subtracted again.
    pub other: f64,
}

impl Machine {
    pub fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8) // user nice system idle iowait irq softirq steal (guest is inside user)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        let idle = fields.get(3)? + fields.get(4)?;
        let irq = fields.get(5)? + fields.get(6)?;
        Some(Self { at: Instant::now(), busy: fields.iter().sum::<u64>() - idle, irq, bench: process_ticks("self")? })
    }

    /// The shares since `before`, given the proxy's CPU ticks over the same window.
    pub fn share_since(&self, before: &Machine, proxy_ticks: u64) -> CpuShare {
        let seconds = self.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let percent = |ticks: u64| ticks as f64 * TICK.as_secs_f64() / seconds * 100.0;
        let bench = self.bench.saturating_sub(before.bench);
        let busy = self.busy.saturating_sub(before.busy);
        let irq = self.irq.saturating_sub(before.irq);
        CpuShare {
            bench: percent(bench),
            proxy: percent(proxy_ticks),
            irq: percent(irq),
            other: percent(busy.saturating_sub(bench + proxy_ticks + irq)),
        }
    }
}

/// `model name` of the first CPU.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim().to_string()))
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| "unknown".into(), |k| k.trim().to_string())
}

/// The 1, 5 and 15 minute load averages, as `uptime` shows them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
