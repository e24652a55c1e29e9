//! The host's CPU as a compiler emitting code for it sees it: read once per process
//! (/proc/cpuinfo is large on machines with many cores).

use std::sync::OnceLock;

/// What identifies the host's CPU: on Linux its vendor, model and feature flags; elsewhere the
/// architecture alone.
pub(crate) fn description() -> &'static str {
    static HOST_CPU: OnceLock<String> = OnceLock::new();
    HOST_CPU.get_or_init(|| describe(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default()))
}

fn describe(cpuinfo: &str) -> String {
    let first = cpuinfo.split("\n\n").next().unwrap_or_default();
    let mut cpu: Vec<&str> = first
        .lines()
        .filter(|l| {
            ["vendor_id", "model name", "flags", "Features", "CPU part"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .collect();
    cpu.push(std::env::consts::ARCH);
    cpu.join("\n")
}

/// Whether the CPU `description` describes has the feature flag `flag` (as /proc/cpuinfo
/// spells it, e.g. `avx512_fp16`).
pub(crate) fn has_feature(description: &str, flag: &str) -> bool {
    description
        .lines()
        .filter(|l| l.starts_with("flags") || l.starts_with("Features"))
        .filter_map(|l| l.split_once(':'))
        .any(|(_, flags)| flags.split_whitespace().any(|f| f == flag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_flags_are_read_from_the_first_processor() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\n\
                       flags\t\t: fpu avx2 avx512f avx512_fp16\n\nprocessor\t: 1\nflags\t\t: fpu\n";
        let d = describe(cpuinfo);
        assert!(d.contains("model name\t: Xeon") && d.ends_with(std::env::consts::ARCH));
        assert!(has_feature(&d, "avx512_fp16") && has_feature(&d, "avx2"));
        // A flag's prefix is not the flag.
        assert!(!has_feature(&d, "avx512") && !has_feature(&d, "avx512_bf16"));
        assert!(!has_feature("model name\t: avx512_fp16", "avx512_fp16"));
    }
}
