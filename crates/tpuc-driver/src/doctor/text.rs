//! The report as people read it: `tpuc doctor`'s text, and `print(tpuc.doctor(...))`'s.

use super::{human_bytes, Projection, Report};

/// The report as people read it.
pub fn text(r: &Report) -> String {
    let mut out = Vec::new();
    let layout = match (&r.mesh, &r.plan) {
        (Some(mesh), Some(plan)) => format!(", mesh {mesh}, plan {plan}"),
        (Some(mesh), None) => format!(", mesh {mesh}"),
        _ => String::new(),
    };
    out.push(format!(
        "tpuc doctor: {} on {} ({} device{}{layout})",
        r.program,
        r.platform,
        r.devices,
        if r.devices == 1 { "" } else { "s" }
    ));
    out.push("program".into());
    for input in &r.inputs {
        out.push(format!(
            "  input     {}: {}[{}]",
            input.name,
            input.dtype,
            input.shape.join(", ")
        ));
    }
    let w = &r.weights;
    out.push(format!(
        "  weights   {} tensors, {} (parameters {}, buffers {}, constants {})",
        w.count,
        human_bytes(w.bytes),
        human_bytes(w.parameters),
        human_bytes(w.buffers),
        human_bytes(w.constants)
    ));
    for s in &r.symbols {
        let range = match s.max {
            Some(max) => format!("{}..{max}", s.min),
            None => format!("{}.. (no end)", s.min),
        };
        let example = s
            .example
            .map_or_else(String::new, |e| format!(", exported at {e}"));
        let listed: Vec<String> = s.buckets.iter().map(i64::to_string).collect();
        let upto = if s.truncated {
            " (counted up to the limit)"
        } else {
            ""
        };
        out.push(format!(
            "  size      {} in {range}{example}: {} executable{}{upto} ({})",
            s.name,
            s.buckets.len(),
            if s.buckets.len() == 1 { "" } else { "s" },
            shorten(&listed)
        ));
    }
    out.push("coverage".into());
    if r.coverage.failures.is_empty() && r.compiled.is_some() {
        out.push("  every op lowers".into());
    }
    for f in &r.coverage.failures {
        let at = f
            .source
            .as_ref()
            .map_or_else(String::new, |s| format!(" at {s}"));
        let why = if f.reason.is_empty() {
            " (no lowering)".to_string()
        } else {
            format!(": {}", f.reason)
        };
        out.push(format!("  {} (node {}){at}{why}", f.op, f.node));
    }
    if let Some(why) = &r.coverage.error {
        out.push(format!("  does not lower: {why}"));
    }
    if let Some(why) = &r.coverage.per_size {
        out.push(format!("  compiles per size, not per bucket: {why}"));
    }
    if let Some(c) = &r.compiled {
        let m = &c.memory;
        out.push("memory per device (XLA's buffer assignment, compiled without running)".into());
        let of = m.capacity.map_or_else(String::new, |cap| {
            let whose = if m.capacity_from_plugin {
                " (the plugin's limit)"
            } else {
                ""
            };
            format!(" of {}{whose}", human_bytes(cap))
        });
        out.push(format!(
            "  total {}{of}: arguments {}, outputs {} ({} in place of arguments), temporaries {}, code {}",
            human_bytes(m.total),
            human_bytes(m.arguments),
            human_bytes(m.outputs),
            human_bytes(m.aliased),
            human_bytes(m.temporaries),
            human_bytes(m.code)
        ));
        out.push("collectives per step (one device's program)".into());
        if c.collectives.is_empty() {
            out.push("  none".into());
        }
        for k in &c.collectives {
            let nested = if k.nested > 0 {
                format!(", {} inside loops or calls (counted once)", k.nested)
            } else {
                String::new()
            };
            out.push(format!(
                "  {:<20} {:>4}  {}{nested}",
                k.kind,
                k.count,
                human_bytes(k.bytes)
            ));
            for site in &k.sites {
                let at = site
                    .source
                    .as_ref()
                    .map_or_else(String::new, |s| format!(" at {s}"));
                let op = if site.op.is_empty() {
                    "(no op name)"
                } else {
                    &site.op
                };
                out.push(format!("      {:>3}x {op}{at}", site.count));
            }
        }
        let cost = &c.cost;
        out.push("cost per step".into());
        let loops = if cost.loops > 0 {
            format!(", {} loop bodies counted once", cost.loops)
        } else {
            String::new()
        };
        out.push(format!(
            "  tpuc's IR: {} FLOP, {} transcendentals, {} moved if nothing were fused{loops}",
            si(cost.flops),
            si(cost.transcendentals),
            human_bytes(cost.bytes as u64)
        ));
        out.push(format!(
            "  products (matmuls, convolutions): {} FLOP in tpuc's IR, {} in XLA's optimized program (one device)",
            si(cost.product_flops),
            si(cost.xla_product_flops)
        ));
        out.push(format!(
            "  XLA's optimized program (one device): {} read and written, fusions at their boundary",
            human_bytes(cost.xla_bytes as u64)
        ));
        let xla: Vec<String> = ["flops", "transcendentals", "bytes accessed"]
            .iter()
            .filter_map(|k| Some(format!("{k} {}", si(*cost.xla.get(*k)?))))
            .collect();
        if !xla.is_empty() {
            out.push(format!(
                "  XLA's cost analysis, one device: {}",
                xla.join(", ")
            ));
        }
        out.push(format!(
            "time: lower {:.0} ms, compile {:.0} ms",
            c.lower_seconds * 1e3,
            c.compile_seconds * 1e3
        ));
    }
    if let Some(p) = &r.projection {
        out.push(projection_text(p));
    }
    if r.problems.is_empty() {
        out.push("verdict: ready to run".into());
    } else {
        out.push(format!(
            "verdict: {} problem{}",
            r.problems.len(),
            if r.problems.len() == 1 { "" } else { "s" }
        ));
        for p in &r.problems {
            out.push(format!("  - {p}"));
        }
    }
    out.join("\n")
}

/// A projection onto an accelerator as people read it.
pub fn projection_text(p: &Projection) -> String {
    let t = &p.target;
    let mut out = vec![
        format!(
            "on {}: {} (estimates from public peak figures, not measurements)",
            t.name, t.description
        ),
        format!(
            "  per chip: peak {}FLOP/s ({} products, {} precision), {} at {}B/s, {} {}B/s among {} chips, {} {}B/s beyond",
            si(p.peak_flops),
            p.dtype,
            p.precision,
            human_bytes(t.memory),
            si(t.memory_bandwidth),
            t.link,
            si(t.link_bandwidth),
            t.link_chips,
            t.network,
            si(t.network_bandwidth)
        ),
    ];
    let e = &p.as_examined;
    let collectives: Vec<String> = e
        .collectives
        .iter()
        .map(|c| format!("{} {}", c.kind, seconds(c.seconds)))
        .collect();
    out.push(format!(
        "  as examined, {} chip{}: memory {} ({}), compute {}, memory traffic {}, collectives {}; step {} ({}-bound), MFU {:.0}%",
        e.chips,
        if e.chips == 1 { "" } else { "s" },
        human_bytes(e.memory),
        if e.fits { "fits" } else { "does not fit" },
        seconds(e.compute_seconds),
        seconds(e.memory_seconds),
        if collectives.is_empty() {
            "none".to_string()
        } else {
            collectives.join(", ")
        },
        seconds(e.step_seconds),
        e.bound,
        e.mfu * 100.0
    ));
    out.push(
        "  scaling (each chip runs the examined step; the state whole under dp, split under fsdp)"
            .into(),
    );
    out.push(format!(
        "    {:<5} {:>6}  {:>10} {:>5}  {:>10}  {:>10}  {:>6}  {:>5}  bound",
        "plan", "chips", "memory", "fits", "step", "collect.", "effic.", "MFU"
    ));
    // Every size JSON has; here the small ones, every fourfold step, and either side of the
    // edge of the interconnect's domain.
    let within = 1usize << t.link_chips.ilog2();
    let shown = |chips: usize| {
        chips <= 8
            || chips.trailing_zeros().is_multiple_of(2)
            || chips == within
            || chips == within * 2
    };
    for r in p.scaling.iter().filter(|r| shown(r.step.chips)) {
        let s = &r.step;
        let communication: f64 = s.collectives.iter().map(|c| c.seconds).sum();
        out.push(format!(
            "    {:<5} {:>6}  {:>10} {:>5}  {:>10}  {:>10}  {:>5.0}%  {:>4.0}%  {}",
            r.plan,
            s.chips,
            human_bytes(s.memory),
            if s.fits { "yes" } else { "no" },
            seconds(s.step_seconds),
            seconds(communication),
            r.efficiency * 100.0,
            s.mfu * 100.0,
            s.bound
        ));
    }
    for f in &p.findings {
        out.push(format!("  - {f}"));
    }
    out.join("\n")
}

/// A duration with a unit fit for it.
fn seconds(s: f64) -> String {
    if s == 0.0 {
        "0".into()
    } else if s < 1e-3 {
        format!("{:.1} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// A count with an SI prefix (`1.23 G`).
fn si(value: f64) -> String {
    const PREFIXES: [&str; 6] = ["", "k", "M", "G", "T", "P"];
    let mut v = value;
    let mut i = 0;
    while v.abs() >= 1000.0 && i < PREFIXES.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2} {}", PREFIXES[i])
    }
}

/// A long list as its first and last items.
fn shorten(items: &[String]) -> String {
    if items.len() <= 8 {
        return items.join(", ");
    }
    format!(
        "{}, ..., {}",
        items[..4].join(", "),
        items[items.len() - 2..].join(", ")
    )
}
