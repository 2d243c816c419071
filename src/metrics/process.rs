//! The standard `process_*` metrics, read from /proc/self when /metrics is scraped.
//!
//! Linux reports CPU time in USER_HZ ticks, which is 100 on every
//! architecture tollgate is built for; on other systems nothing is reported.

const USER_HZ: f64 = 100.0;

/// One reading of the process' resources.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Sample {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

/// Reads /proc/self; `None` where /proc is not there. Blocking file reads:
/// call it off the async runtime.
pub fn sample() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Field numbers from proc(5), minus the two before the ')'.
    let num = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let ticks = num(14)? + num(15)?;
    let start_ticks = num(22);
    let virtual_bytes = num(23).unwrap_or(0);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let resident_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))?
                .split_whitespace()
                .nth(3)?
                .parse()
                .ok()
        });
    let boot_time = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse::<u64>()
            .ok()
    });
    Some(Sample {
        cpu_seconds: ticks as f64 / USER_HZ,
        resident_bytes: resident_kb * 1024,
        virtual_bytes,
        open_fds,
        max_fds,
        start_time_seconds: boot_time
            .zip(start_ticks)
            .map(|(b, t)| b as f64 + t as f64 / USER_HZ),
    })
}

impl Sample {
    pub fn render(&self, out: &mut String) {
        let mut one = |name: &str, kind: &str, help: &str, v: f64| {
            super::text::family(out, name, help, kind);
            super::text::sample(out, name, "", v);
        };
        one(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            self.cpu_seconds,
        );
        one(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            self.resident_bytes as f64,
        );
        one(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            self.virtual_bytes as f64,
        );
        one(
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            self.open_fds as f64,
        );
        if let Some(m) = self.max_fds {
            one(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                m as f64,
            );
        }
        if let Some(s) = self.start_time_seconds {
            one(
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since the Unix epoch in seconds.",
                s,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_cpu_time_memory_and_open_files() {
        let s = super::sample().expect("/proc is mounted on Linux");
        assert!(s.resident_bytes > 0);
        assert!(s.open_fds >= 3, "stdin, stdout, stderr at least");
        assert!(s.max_fds.unwrap_or(0) >= s.open_fds);
        assert!(s.start_time_seconds.unwrap_or(0.0) > 1.0e9);
    }
}
