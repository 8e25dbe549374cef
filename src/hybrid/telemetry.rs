//! What RFHYBRID ran where: one `ExecutionEvent` per node and per transfer, `BackendStats` per
//! device, a summary table, JSON and a Chrome trace (ROCMFORGE_TELEMETRY, ROCMFORGE_TRACE).
//!
//! Recording is a push and a few additions. Events are kept up to `MAX_EVENTS` (about 150 MB
//! at most); past that only the aggregates grow, and the reports say how many were dropped.

use super::Place;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Events kept for the JSON and the trace; later ones only count in the aggregates.
pub const MAX_EVENTS: usize = 1_000_000;

/// A prediction within this fraction of the measured time counts as accurate (issue 22's target:
/// accurate nodes cover at least 80% of the graph's time).
pub const ACCURATE_WITHIN: f64 = 0.25;

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum EventKind {
    Compute,
    /// A copy between host and GPU memory, to `to`.
    Transfer {
        to: Place,
    },
}

#[derive(Clone, Debug)]
pub struct ExecutionEvent {
    /// Which graph (counted from 0 per backend).
    pub graph: u64,
    pub node: String,
    /// ggml op name ("MUL_MAT"); for transfers, what was moved ("weights", "activations").
    pub op: &'static str,
    pub kind: EventKind,
    pub place: Place,
    /// `SelectionReason` as text.
    pub reason: String,
    pub predicted_us: f64,
    pub measured_us: f64,
    pub bytes_moved: u64,
    /// Start, µs since the telemetry began.
    pub start_us: f64,
    /// The node was timed alone (false: its share of a segment timed as a whole, by
    /// prediction; such events do not count towards the prediction accuracy).
    pub timed: bool,
}

#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct BackendStats {
    pub nodes: u64,
    pub compute_us: f64,
    pub predicted_us: f64,
    /// Transfers into this device.
    pub transfers: u64,
    pub bytes_in: u64,
    pub transfer_us: f64,
}

/// Compute nodes of one op on one device (`operations_by_type`).
#[derive(Clone, Debug, PartialEq)]
pub struct OpTypeRow {
    pub op: &'static str,
    pub place: Place,
    pub count: u64,
    /// Sum of measured µs.
    pub measured_us: f64,
    /// Sum of predicted µs.
    pub predicted_us: f64,
    /// Mean of |predicted - measured| / measured over the nodes with both, %; None if none.
    pub mean_error_pct: Option<f64>,
}

/// Running sums of one (op, device).
#[derive(Clone, Copy, Default)]
struct OpAgg {
    count: u64,
    measured_us: f64,
    predicted_us: f64,
    err_pct_sum: f64,
    err_n: u64,
}

/// What ROCMFORGE_TELEMETRY asked for.
#[derive(Clone, Debug, PartialEq)]
enum Report {
    Off,
    Summary,
    Json(PathBuf),
}

/// One node of a `SegmentTemplate`.
pub struct TemplateNode {
    pub name: String,
    pub op: &'static str,
    pub place: Place,
    pub reason: String,
    pub predicted_us: f64,
}

/// A segment timed as a whole, as it comes back every token: its nodes are recorded once, and
/// each run adds one entry (expanded into the nodes' events, each the share of the time its
/// prediction has, only when the JSON or the trace is written). Recording a token of an
/// 8B-class model is then a handful of additions instead of ~700 events.
pub struct SegmentTemplate {
    nodes: Vec<TemplateNode>,
    predicted_us: f64,
    /// Per (op, device): nodes and their predicted µs.
    by_op: Vec<((&'static str, Place), u64, f64)>,
}

impl SegmentTemplate {
    pub fn new(nodes: Vec<TemplateNode>) -> SegmentTemplate {
        let mut by_op: Vec<((&'static str, Place), u64, f64)> = Vec::new();
        for n in &nodes {
            let p = fin(n.predicted_us);
            match by_op.iter_mut().find(|e| e.0 == (n.op, n.place)) {
                Some(e) => (e.1, e.2) = (e.1 + 1, e.2 + p),
                None => by_op.push(((n.op, n.place), 1, p)),
            }
        }
        SegmentTemplate {
            predicted_us: nodes.iter().map(|n| fin(n.predicted_us)).sum(),
            nodes,
            by_op,
        }
    }

    /// Nodes in the segment.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A node's share of a run that took `us` (as `record_segment` gives it).
    fn share(&self, us: f64, predicted_us: f64, count: u64) -> f64 {
        if self.predicted_us > 0.0 {
            us * predicted_us / self.predicted_us
        } else {
            us * count as f64 / self.nodes.len().max(1) as f64
        }
    }
}

/// What is kept for the JSON and the trace.
enum Entry {
    One(ExecutionEvent),
    /// A run of a template: graph, start and length (µs).
    Repeat(u64, std::sync::Arc<SegmentTemplate>, f64, f64),
}

pub struct Telemetry {
    entries: Vec<Entry>,
    /// Events the entries expand to.
    kept: usize,
    epoch: std::time::Instant,
    enabled: bool,
    report: Report,
    trace: Option<PathBuf>,
    finished: bool,
    /// Events kept at most (MAX_EVENTS; tests lower it).
    cap: usize,
    dropped: u64,
    /// Indexed by `slot(place)`.
    stats: [BackendStats; 2],
    ops: HashMap<(&'static str, Place), OpAgg>,
    /// Distinct graph numbers seen (they only grow per backend, so a change is a new graph).
    graphs: u64,
    last_graph: Option<u64>,
    /// Measured µs of compute nodes whose prediction was within ACCURATE_WITHIN.
    accurate_us: f64,
    /// Measured µs of compute nodes timed alone.
    timed_us: f64,
    /// Compute nodes with a usable prediction, and those within ACCURATE_WITHIN.
    predicted_nodes: u64,
    accurate_nodes: u64,
}

fn slot(p: Place) -> usize {
    match p {
        Place::Cpu => 0,
        Place::Gpu => 1,
    }
}

const PLACES: [Place; 2] = [Place::Cpu, Place::Gpu];

/// A finite value, else 0 (aggregates never take NaN or infinity from a bad measurement).
fn fin(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

/// |predicted - measured| / measured, if both are usable.
fn rel_error(predicted: f64, measured: f64) -> Option<f64> {
    (predicted.is_finite() && predicted > 0.0 && measured.is_finite() && measured > 0.0)
        .then(|| (predicted - measured).abs() / measured)
}

impl Telemetry {
    /// Per ROCMFORGE_TELEMETRY / ROCMFORGE_TRACE.
    pub fn from_tuning() -> Telemetry {
        let t = crate::tuning::get();
        let report = match t.telemetry.as_deref() {
            None => Report::Off,
            Some(v) if v.to_ascii_lowercase().ends_with(".json") => Report::Json(PathBuf::from(v)),
            Some(v) => {
                if !v.eq_ignore_ascii_case("summary") {
                    crate::log_warn!(
                        "ROCMFORGE_TELEMETRY={v}: neither \"summary\" nor a .json path; printing the summary"
                    );
                }
                Report::Summary
            }
        };
        Telemetry::with_outputs(
            report == Report::Summary,
            match report {
                Report::Json(p) => Some(p),
                _ => None,
            },
            t.trace.clone(),
        )
    }

    /// Telemetry that reports as asked here (tests, C): `summary` prints the table at `finish`,
    /// `json` and `trace` are files written then. Enabled when any of them is asked for.
    pub fn with_outputs(summary: bool, json: Option<PathBuf>, trace: Option<PathBuf>) -> Telemetry {
        let report = match (json, summary) {
            (Some(p), _) => Report::Json(p),
            (None, true) => Report::Summary,
            (None, false) => Report::Off,
        };
        Telemetry {
            entries: Vec::new(),
            kept: 0,
            epoch: std::time::Instant::now(),
            enabled: report != Report::Off || trace.is_some(),
            report,
            trace,
            finished: false,
            cap: MAX_EVENTS,
            dropped: 0,
            stats: [BackendStats::default(); 2],
            ops: HashMap::new(),
            graphs: 0,
            last_graph: None,
            accurate_us: 0.0,
            timed_us: 0.0,
            predicted_nodes: 0,
            accurate_nodes: 0,
        }
    }

    /// Whether events are being recorded.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Turns recording on or off (from C).
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
    }

    /// µs since the telemetry began (for `start_us`).
    pub fn now_us(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1e6
    }

    /// Events not kept (past MAX_EVENTS); the aggregates count them.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Distinct graphs seen.
    pub fn graphs(&self) -> u64 {
        self.graphs
    }

    pub fn record(&mut self, ev: ExecutionEvent) {
        // New events: the next `finish` (another backend freed) reports again.
        self.finished = false;
        if self.last_graph != Some(ev.graph) {
            self.graphs += 1;
            self.last_graph = Some(ev.graph);
        }
        let (measured, predicted) = (fin(ev.measured_us), fin(ev.predicted_us));
        match ev.kind {
            EventKind::Compute => {
                let s = &mut self.stats[slot(ev.place)];
                s.nodes += 1;
                s.compute_us += measured;
                s.predicted_us += predicted;
                let a = self.ops.entry((ev.op, ev.place)).or_default();
                a.count += 1;
                a.measured_us += measured;
                a.predicted_us += predicted;
                if ev.timed {
                    self.timed_us += measured;
                }
                if let Some(e) = rel_error(ev.predicted_us, ev.measured_us).filter(|_| ev.timed) {
                    a.err_pct_sum += e * 100.0;
                    a.err_n += 1;
                    self.predicted_nodes += 1;
                    if e <= ACCURATE_WITHIN {
                        self.accurate_nodes += 1;
                        self.accurate_us += measured;
                    }
                }
            }
            EventKind::Transfer { to } => {
                let s = &mut self.stats[slot(to)];
                s.transfers += 1;
                s.bytes_in += ev.bytes_moved;
                s.transfer_us += measured;
            }
        }
        if self.kept < self.cap {
            self.kept += 1;
            self.entries.push(Entry::One(ev));
        } else {
            self.dropped += 1;
        }
    }

    /// A run of `template` (graph `graph`, `us` from `start_us`): as `record` of each of its
    /// nodes with its share of the time, not timed alone.
    pub fn record_repeat(
        &mut self,
        graph: u64,
        template: &std::sync::Arc<SegmentTemplate>,
        start_us: f64,
        us: f64,
    ) {
        self.finished = false;
        if self.last_graph != Some(graph) {
            self.graphs += 1;
            self.last_graph = Some(graph);
        }
        let us = fin(us);
        for &((op, place), count, predicted) in &template.by_op {
            let measured = template.share(us, predicted, count);
            let s = &mut self.stats[slot(place)];
            s.nodes += count;
            s.compute_us += measured;
            s.predicted_us += predicted;
            let a = self.ops.entry((op, place)).or_default();
            a.count += count;
            a.measured_us += measured;
            a.predicted_us += predicted;
        }
        let n = template.nodes.len();
        if self.kept + n <= self.cap {
            self.kept += n;
            self.entries
                .push(Entry::Repeat(graph, template.clone(), start_us, us));
        } else {
            self.dropped += n as u64;
        }
    }

    /// Every event kept, in order (the runs of templates expanded).
    pub fn for_each_event(&self, mut f: impl FnMut(&ExecutionEvent)) {
        for e in &self.entries {
            match e {
                Entry::One(ev) => f(ev),
                Entry::Repeat(graph, t, start_us, us) => {
                    let mut at = *start_us;
                    for n in &t.nodes {
                        let share = t.share(*us, fin(n.predicted_us), 1);
                        f(&ExecutionEvent {
                            graph: *graph,
                            node: n.name.clone(),
                            op: n.op,
                            kind: EventKind::Compute,
                            place: n.place,
                            reason: n.reason.clone(),
                            predicted_us: n.predicted_us,
                            measured_us: share,
                            bytes_moved: 0,
                            start_us: at,
                            timed: false,
                        });
                        at += share;
                    }
                }
            }
        }
    }

    /// Every event kept (the runs of templates expanded).
    pub fn events(&self) -> Vec<ExecutionEvent> {
        let mut out = Vec::with_capacity(self.kept);
        self.for_each_event(|e| out.push(e.clone()));
        out
    }

    /// How many events are kept.
    pub fn event_count(&self) -> usize {
        self.kept
    }

    pub fn stats(&self, place: Place) -> BackendStats {
        self.stats[slot(place)]
    }

    /// Compute nodes by (op, device), the most measured time first.
    pub fn operations_by_type(&self) -> Vec<OpTypeRow> {
        let mut rows: Vec<OpTypeRow> = self
            .ops
            .iter()
            .map(|(&(op, place), a)| OpTypeRow {
                op,
                place,
                count: a.count,
                measured_us: a.measured_us,
                predicted_us: a.predicted_us,
                mean_error_pct: (a.err_n > 0).then(|| a.err_pct_sum / a.err_n as f64),
            })
            .collect();
        rows.sort_by(|a, b| {
            b.measured_us
                .total_cmp(&a.measured_us)
                .then(a.op.cmp(b.op))
                .then(slot(a.place).cmp(&slot(b.place)))
        });
        rows
    }

    /// Share (0..1) of the time of nodes timed alone spent in nodes predicted within ±25%;
    /// None before any node was timed alone.
    pub fn accurate_share(&self) -> Option<f64> {
        (self.timed_us > 0.0).then(|| self.accurate_us / self.timed_us)
    }

    /// A table: ops by type and device, time and share per device, transfers, prediction error.
    pub fn execution_summary(&self) -> String {
        let mut s = String::new();
        let total_us: f64 = self.stats.iter().map(|s| s.compute_us).sum();
        let share = |us: f64| {
            if total_us > 0.0 {
                format!("{:.1}%", 100.0 * us / total_us)
            } else {
                "-".to_string()
            }
        };
        let nodes: u64 = self.stats.iter().map(|s| s.nodes).sum();
        let _ = writeln!(
            s,
            "RFHYBRID telemetry: {} graphs, {} nodes, {:.3} ms compute",
            self.graphs,
            nodes,
            total_us / 1e3
        );
        let _ = writeln!(
            s,
            "{:<8} {:>10} {:>12} {:>7} {:>12}",
            "device", "nodes", "time ms", "share", "predicted ms"
        );
        for p in PLACES {
            let st = self.stats(p);
            let _ = writeln!(
                s,
                "{:<8} {:>10} {:>12.3} {:>7} {:>12.3}",
                p.name(),
                st.nodes,
                st.compute_us / 1e3,
                share(st.compute_us),
                st.predicted_us / 1e3
            );
        }
        let _ = writeln!(s, "ops by type and device:");
        let _ = writeln!(
            s,
            "{:<16} {:<6} {:>10} {:>12} {:>7} {:>10}",
            "op", "device", "count", "time ms", "share", "pred err"
        );
        for r in self.operations_by_type() {
            let err = r
                .mean_error_pct
                .map_or_else(|| "-".to_string(), |e| format!("{e:.1}%"));
            let _ = writeln!(
                s,
                "{:<16} {:<6} {:>10} {:>12.3} {:>7} {:>10}",
                r.op,
                r.place.name(),
                r.count,
                r.measured_us / 1e3,
                share(r.measured_us),
                err
            );
        }
        let _ = writeln!(s, "transfers:");
        let _ = writeln!(
            s,
            "{:<10} {:>10} {:>12} {:>12} {:>8}",
            "direction", "count", "MB", "time ms", "GB/s"
        );
        for p in PLACES {
            let st = self.stats(p);
            let gbs = if st.transfer_us > 0.0 {
                format!("{:.2}", st.bytes_in as f64 / st.transfer_us / 1e3)
            } else {
                "-".to_string()
            };
            let _ = writeln!(
                s,
                "{:<10} {:>10} {:>12.3} {:>12.3} {:>8}",
                format!("to {}", p.name()),
                st.transfers,
                st.bytes_in as f64 / 1e6,
                st.transfer_us / 1e3,
                gbs
            );
        }
        match self.accurate_share() {
            Some(a) => {
                let _ = writeln!(
                    s,
                    "prediction: {:.1}% of the time of nodes timed alone in nodes predicted within ±{:.0}% \
                     (target >= 80%); {} of {} nodes timed alone, {} of them within",
                    100.0 * a,
                    100.0 * ACCURATE_WITHIN,
                    self.predicted_nodes,
                    nodes,
                    self.accurate_nodes
                );
            }
            None => {
                let _ = writeln!(s, "prediction: no compute time measured");
            }
        }
        if self.dropped > 0 {
            let _ = writeln!(
                s,
                "events: {} kept, {} dropped past {} (the tables above count them all)",
                self.kept, self.dropped, self.cap
            );
        }
        s
    }

    /// `{"events":[...],"stats":{...}}`.
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(64 + self.kept * 200);
        s.push_str("{\"events\":[");
        let mut first = true;
        self.for_each_event(|e| {
            if !std::mem::take(&mut first) {
                s.push(',');
            }
            let kind = match e.kind {
                EventKind::Compute => "compute",
                EventKind::Transfer { .. } => "transfer",
            };
            let device = match e.kind {
                EventKind::Compute => e.place,
                EventKind::Transfer { to } => to,
            };
            s.push_str("{\"graph\":");
            let _ = write!(s, "{}", e.graph);
            s.push_str(",\"node\":");
            json_str(&mut s, &e.node);
            s.push_str(",\"op\":");
            json_str(&mut s, e.op);
            let _ = write!(s, ",\"kind\":\"{kind}\",\"device\":\"{}\"", device.name());
            s.push_str(",\"reason\":");
            json_str(&mut s, &e.reason);
            s.push_str(",\"predicted_us\":");
            json_num(&mut s, e.predicted_us);
            s.push_str(",\"measured_us\":");
            json_num(&mut s, e.measured_us);
            let _ = write!(s, ",\"bytes\":{},\"timed\":{}", e.bytes_moved, e.timed);
            s.push_str(",\"start_us\":");
            json_num(&mut s, e.start_us);
            s.push('}');
        });
        s.push_str("],\"stats\":{");
        for p in PLACES {
            let st = self.stats(p);
            let _ = write!(
                s,
                "\"{}\":{{\"nodes\":{},\"compute_us\":",
                p.name(),
                st.nodes
            );
            json_num(&mut s, st.compute_us);
            s.push_str(",\"predicted_us\":");
            json_num(&mut s, st.predicted_us);
            let _ = write!(
                s,
                ",\"transfers_in\":{},\"bytes_in\":{},\"transfer_us\":",
                st.transfers, st.bytes_in
            );
            json_num(&mut s, st.transfer_us);
            s.push_str("},");
        }
        s.push_str("\"ops\":[");
        for (i, r) in self.operations_by_type().iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str("{\"op\":");
            json_str(&mut s, r.op);
            let _ = write!(
                s,
                ",\"device\":\"{}\",\"count\":{},\"measured_us\":",
                r.place.name(),
                r.count
            );
            json_num(&mut s, r.measured_us);
            s.push_str(",\"predicted_us\":");
            json_num(&mut s, r.predicted_us);
            s.push_str(",\"mean_error_pct\":");
            json_num(&mut s, r.mean_error_pct.unwrap_or(f64::NAN));
            s.push('}');
        }
        let _ = write!(s, "],\"graphs\":{},\"accurate_share\":", self.graphs);
        json_num(&mut s, self.accurate_share().unwrap_or(f64::NAN));
        let _ = write!(s, ",\"dropped\":{}}}}}", self.dropped);
        s
    }

    /// Chrome trace-event JSON (one track per device and one for transfers).
    pub fn chrome_trace(&self) -> String {
        let mut s = String::with_capacity(512 + self.kept * 200);
        s.push_str("{\"traceEvents\":[");
        s.push_str(
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\
             \"args\":{\"name\":\"rocmforge RFHYBRID\"}}",
        );
        for (tid, name) in [(1, "RFHYBRID CPU"), (2, "RFHYBRID GPU"), (3, "transfers")] {
            let _ = write!(
                s,
                ",{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{tid},\
                 \"args\":{{\"name\":\"{name}\"}}}},\
                 {{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":{tid},\
                 \"args\":{{\"sort_index\":{tid}}}}}"
            );
        }
        self.for_each_event(|e| {
            let (tid, cat) = match (e.kind, e.place) {
                (EventKind::Compute, Place::Cpu) => (1, "compute"),
                (EventKind::Compute, Place::Gpu) => (2, "compute"),
                (EventKind::Transfer { .. }, _) => (3, "transfer"),
            };
            // Perfetto needs numbers: a bad time becomes 0.
            let (ts, dur) = (fin(e.start_us).max(0.0), fin(e.measured_us).max(0.0));
            s.push_str(",{\"name\":");
            let name = match e.kind {
                EventKind::Compute => e.op.to_string(),
                EventKind::Transfer { to } => format!("{} to {}", e.op, to.name()),
            };
            json_str(&mut s, &name);
            let _ = write!(
                s,
                ",\"cat\":\"{cat}\",\"ph\":\"X\",\"pid\":1,\"tid\":{tid},\"ts\":{ts:.3},\"dur\":{dur:.3},\"args\":{{\"node\":"
            );
            json_str(&mut s, &e.node);
            let _ = write!(s, ",\"graph\":{},\"reason\":", e.graph);
            json_str(&mut s, &e.reason);
            s.push_str(",\"predicted_us\":");
            json_num(&mut s, e.predicted_us);
            let _ = write!(s, ",\"bytes\":{}}}}}", e.bytes_moved);
        });
        s.push_str("],\"displayTimeUnit\":\"ms\"}");
        s
    }

    /// At backend free: prints the summary / writes the files the knobs asked for. Errors are
    /// logged; a second call does nothing.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        match &self.report {
            Report::Off => {}
            Report::Summary => {
                // On stderr, not through the host's logger (which may be quiet): it was asked for.
                eprint!("{}", self.execution_summary());
            }
            Report::Json(p) => write_report("telemetry", p, &self.to_json()),
        }
        if let Some(p) = &self.trace {
            write_report("trace", p, &self.chrome_trace());
        }
    }
}

fn write_report(what: &str, path: &std::path::Path, text: &str) {
    match std::fs::write(path, text) {
        Ok(()) => crate::log_info!("RFHYBRID {what} written to {}", path.display()),
        Err(e) => crate::log_error!("RFHYBRID {what}: cannot write {}: {e}", path.display()),
    }
}

/// Appends `v` as a JSON string.
fn json_str(s: &mut String, v: &str) {
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
}

/// Appends `v` as a JSON number; NaN and infinities (which JSON lacks) as null.
fn json_num(s: &mut String, v: f64) {
    if v.is_finite() {
        let _ = write!(s, "{v:.3}");
    } else {
        s.push_str("null");
    }
}

/// A strict JSON syntax check for the tests (no JSON crate among the dependencies).
#[cfg(test)]
pub(crate) fn json_valid(text: &str) -> bool {
    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && matches!(b[*i], b' ' | b'\n' | b'\r' | b'\t') {
            *i += 1;
        }
    }
    fn string(b: &[u8], i: &mut usize) -> bool {
        if b.get(*i) != Some(&b'"') {
            return false;
        }
        *i += 1;
        while let Some(&c) = b.get(*i) {
            *i += 1;
            match c {
                b'"' => return true,
                b'\\' => match b.get(*i) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => *i += 1,
                    Some(b'u') => {
                        let hex = b.get(*i + 1..*i + 5);
                        if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                            return false;
                        }
                        *i += 5;
                    }
                    _ => return false,
                },
                c if c < 0x20 => return false,
                _ => {}
            }
        }
        false
    }
    fn number(b: &[u8], i: &mut usize) -> bool {
        let start = *i;
        if b.get(*i) == Some(&b'-') {
            *i += 1;
        }
        let digits = |i: &mut usize| {
            let s = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > s
        };
        if !digits(i) {
            return false;
        }
        if b.get(*i) == Some(&b'.') {
            *i += 1;
            if !digits(i) {
                return false;
            }
        }
        if matches!(b.get(*i), Some(b'e' | b'E')) {
            *i += 1;
            if matches!(b.get(*i), Some(b'+' | b'-')) {
                *i += 1;
            }
            if !digits(i) {
                return false;
            }
        }
        *i > start
    }
    fn value(b: &[u8], i: &mut usize, depth: usize) -> bool {
        if depth > 64 {
            return false;
        }
        ws(b, i);
        let ok = match b.get(*i) {
            Some(b'{') => {
                *i += 1;
                ws(b, i);
                if b.get(*i) == Some(&b'}') {
                    *i += 1;
                    true
                } else {
                    loop {
                        ws(b, i);
                        if !string(b, i) {
                            return false;
                        }
                        ws(b, i);
                        if b.get(*i) != Some(&b':') {
                            return false;
                        }
                        *i += 1;
                        if !value(b, i, depth + 1) {
                            return false;
                        }
                        ws(b, i);
                        match b.get(*i) {
                            Some(b',') => *i += 1,
                            Some(b'}') => {
                                *i += 1;
                                break true;
                            }
                            _ => return false,
                        }
                    }
                }
            }
            Some(b'[') => {
                *i += 1;
                ws(b, i);
                if b.get(*i) == Some(&b']') {
                    *i += 1;
                    true
                } else {
                    loop {
                        if !value(b, i, depth + 1) {
                            return false;
                        }
                        ws(b, i);
                        match b.get(*i) {
                            Some(b',') => *i += 1,
                            Some(b']') => {
                                *i += 1;
                                break true;
                            }
                            _ => return false,
                        }
                    }
                }
            }
            Some(b'"') => string(b, i),
            Some(b't') if b[*i..].starts_with(b"true") => {
                *i += 4;
                true
            }
            Some(b'f') if b[*i..].starts_with(b"false") => {
                *i += 5;
                true
            }
            Some(b'n') if b[*i..].starts_with(b"null") => {
                *i += 4;
                true
            }
            _ => number(b, i),
        };
        ok
    }
    let b = text.as_bytes();
    let mut i = 0;
    let ok = value(b, &mut i, 0);
    ws(b, &mut i);
    ok && i == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compute(graph: u64, op: &'static str, place: Place, pred: f64, meas: f64) -> ExecutionEvent {
        ExecutionEvent {
            graph,
            node: format!("{op}-{graph}"),
            op,
            kind: EventKind::Compute,
            place,
            reason: "gpu-available".into(),
            predicted_us: pred,
            measured_us: meas,
            bytes_moved: 0,
            start_us: 10.0,
            timed: true,
        }
    }

    fn transfer(to: Place, bytes: u64, us: f64) -> ExecutionEvent {
        ExecutionEvent {
            graph: 0,
            node: "blk.0.ffn_up.weight".into(),
            op: "weights",
            kind: EventKind::Transfer { to },
            place: to,
            reason: "cost-model".into(),
            predicted_us: us,
            measured_us: us,
            bytes_moved: bytes,
            start_us: 5.0,
            timed: true,
        }
    }

    /// Two graphs: GPU MUL_MATs (one accurate, one 50% off), a CPU GET_ROWS without a
    /// prediction, transfers both ways.
    fn sample() -> Telemetry {
        let mut t = Telemetry::with_outputs(false, None, None);
        t.record(transfer(Place::Gpu, 4_000_000, 200.0));
        t.record(compute(0, "MUL_MAT", Place::Gpu, 110.0, 100.0));
        t.record(compute(0, "MUL_MAT", Place::Gpu, 150.0, 100.0));
        t.record(compute(1, "GET_ROWS", Place::Cpu, 0.0, 50.0));
        t.record(compute(1, "RMS_NORM", Place::Cpu, 48.0, 50.0));
        let mut back = transfer(Place::Cpu, 1_000, 2.0);
        back.graph = 1;
        t.record(back);
        t
    }

    /// A template's runs count as its nodes recorded one by one with their shares, and expand
    /// to the same events.
    #[test]
    fn a_template_run_equals_its_nodes_recorded_one_by_one() {
        let nodes = [
            ("MUL_MAT", Place::Gpu, 30.0),
            ("ADD", Place::Gpu, 10.0),
            ("MUL_MAT", Place::Gpu, 60.0),
        ];
        let template = std::sync::Arc::new(SegmentTemplate::new(
            nodes
                .iter()
                .enumerate()
                .map(|(i, &(op, place, p))| TemplateNode {
                    name: format!("n{i}"),
                    op,
                    place,
                    reason: "gpu-available".into(),
                    predicted_us: p,
                })
                .collect(),
        ));
        let mut by_template = Telemetry::with_outputs(false, None, None);
        let mut by_node = Telemetry::with_outputs(false, None, None);
        for (graph, us, start) in [(3u64, 200.0, 1000.0), (4, 100.0, 5000.0)] {
            by_template.record_repeat(graph, &template, start, us);
            let mut at = start;
            for (i, &(op, place, p)) in nodes.iter().enumerate() {
                let share = us * p / 100.0;
                by_node.record(ExecutionEvent {
                    graph,
                    node: format!("n{i}"),
                    op,
                    kind: EventKind::Compute,
                    place,
                    reason: "gpu-available".into(),
                    predicted_us: p,
                    measured_us: share,
                    bytes_moved: 0,
                    start_us: at,
                    timed: false,
                });
                at += share;
            }
        }
        assert_eq!(by_template.stats(Place::Gpu), by_node.stats(Place::Gpu));
        assert_eq!(by_template.graphs(), 2);
        assert_eq!(by_template.event_count(), 6);
        assert_eq!(by_template.to_json(), by_node.to_json());
        assert_eq!(by_template.chrome_trace(), by_node.chrome_trace());
        let rows = by_template.operations_by_type();
        assert_eq!(
            (rows[0].op, rows[0].count, rows[0].measured_us),
            ("MUL_MAT", 4, 270.0)
        );
        // Past the cap a run is dropped whole, and still counted.
        by_template.cap = 7;
        by_template.record_repeat(5, &template, 9000.0, 100.0);
        assert_eq!((by_template.event_count(), by_template.dropped()), (6, 3));
        assert_eq!(by_template.stats(Place::Gpu).nodes, 9);
    }

    #[test]
    fn stats_per_device() {
        let t = sample();
        let g = t.stats(Place::Gpu);
        assert_eq!(g.nodes, 2);
        assert_eq!(g.compute_us, 200.0);
        assert_eq!(g.predicted_us, 260.0);
        assert_eq!(
            (g.transfers, g.bytes_in, g.transfer_us),
            (1, 4_000_000, 200.0)
        );
        let c = t.stats(Place::Cpu);
        assert_eq!((c.nodes, c.compute_us, c.predicted_us), (2, 100.0, 48.0));
        assert_eq!((c.transfers, c.bytes_in), (1, 1_000));
        assert_eq!(t.graphs(), 2);
    }

    #[test]
    fn rows_by_type_sorted_by_time() {
        let t = sample();
        let rows = t.operations_by_type();
        assert_eq!(rows.len(), 3);
        assert_eq!(
            (rows[0].op, rows[0].place, rows[0].count),
            ("MUL_MAT", Place::Gpu, 2)
        );
        assert_eq!(rows[0].measured_us, 200.0);
        // (10% + 50%) / 2.
        assert!((rows[0].mean_error_pct.unwrap() - 30.0).abs() < 1e-9);
        let get_rows = rows.iter().find(|r| r.op == "GET_ROWS").unwrap();
        assert_eq!(get_rows.mean_error_pct, None);
        assert!(rows
            .windows(2)
            .all(|w| w[0].measured_us >= w[1].measured_us));
    }

    #[test]
    fn accuracy_share_counts_time_within_25_percent() {
        let t = sample();
        // Accurate: one GPU MUL_MAT (100) and RMS_NORM (50) out of 300 µs.
        assert!((t.accurate_share().unwrap() - 0.5).abs() < 1e-12);
        let s = t.execution_summary();
        assert!(s.contains("50.0% of the time of nodes timed alone"), "{s}");
        assert!(Telemetry::with_outputs(false, None, None)
            .accurate_share()
            .is_none());
    }

    /// Nodes timed as part of a segment count towards time, not towards the accuracy.
    #[test]
    fn segment_timed_nodes_do_not_count_for_accuracy() {
        let mut t = sample();
        let mut e = compute(9, "ADD", Place::Gpu, 1.0, 1000.0);
        e.timed = false;
        t.record(e);
        assert!((t.accurate_share().unwrap() - 0.5).abs() < 1e-12);
        assert!(t.stats(Place::Gpu).compute_us >= 1000.0);
    }

    #[test]
    fn summary_has_every_block() {
        let s = sample().execution_summary();
        for want in [
            "2 graphs",
            "4 nodes",
            "ops by type and device:",
            "transfers:",
            "to GPU",
            "to CPU",
            "prediction:",
        ] {
            assert!(s.contains(want), "no {want:?} in\n{s}");
        }
        let mm = s.lines().find(|l| l.starts_with("MUL_MAT")).unwrap();
        assert!(mm.contains("GPU") && mm.contains("0.200") && mm.contains("66.7%"));
        assert!(mm.contains("30.0%"), "{mm}");
        let gpu = s.lines().find(|l| l.starts_with("GPU")).unwrap();
        assert!(gpu.contains("66.7%"), "{gpu}");
        let to_gpu = s.lines().find(|l| l.starts_with("to GPU")).unwrap();
        assert!(
            to_gpu.contains("4.000") && to_gpu.contains("20.00"),
            "{to_gpu}"
        );
    }

    #[test]
    fn json_is_valid_and_finite() {
        let mut t = sample();
        let mut odd = compute(2, "SOFT_MAX", Place::Cpu, f64::NAN, f64::INFINITY);
        odd.node = "quote \" backslash \\ newline \n tab \t bell \u{7}".into();
        t.record(odd);
        let j = t.to_json();
        assert!(json_valid(&j), "{j}");
        assert!(!j.contains("NaN") && !j.contains("inf"), "{j}");
        assert!(j.contains("\"predicted_us\":null"));
        assert!(j.contains("\"kind\":\"transfer\",\"device\":\"GPU\""));
        assert!(j.contains("\"stats\":{\"CPU\":{\"nodes\":3"));
        assert!(j.contains("\"dropped\":0"));
        // The bad measurement stays out of the sums.
        assert_eq!(t.stats(Place::Cpu).compute_us, 100.0);
        assert!(!json_valid("{\"a\":NaN}") && !json_valid("{\"a\":1,}") && !json_valid("[1"));
    }

    #[test]
    fn trace_has_tracks_and_complete_events() {
        let t = sample();
        let tr = t.chrome_trace();
        assert!(json_valid(&tr), "{tr}");
        for name in ["RFHYBRID CPU", "RFHYBRID GPU", "transfers"] {
            assert!(
                tr.contains(&format!("\"args\":{{\"name\":\"{name}\"}}")),
                "{name}"
            );
        }
        assert_eq!(tr.matches("\"ph\":\"X\"").count(), 6);
        assert_eq!(tr.matches("\"ph\":\"X\",\"pid\":1,\"tid\":3").count(), 2);
        assert!(tr.contains("\"ts\":10.000,\"dur\":100.000"));
        assert!(!tr.contains("NaN"));
    }

    #[test]
    fn event_cap_keeps_aggregates() {
        let mut t = Telemetry::with_outputs(false, None, None);
        t.cap = 4;
        for i in 0..10 {
            t.record(compute(i, "ADD", Place::Cpu, 1.0, 1.0));
        }
        assert_eq!(t.event_count(), 4);
        assert_eq!(t.dropped(), 6);
        assert_eq!(t.stats(Place::Cpu).nodes, 10);
        assert_eq!(t.operations_by_type()[0].count, 10);
        assert!(t.to_json().contains("\"dropped\":6"));
        assert!(t.execution_summary().contains("6 dropped"));
        assert_eq!(MAX_EVENTS, 1_000_000);
    }

    #[test]
    fn finish_writes_files_once() {
        let dir = std::env::temp_dir().join(format!("rf-telemetry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (json, trace) = (dir.join("t.json"), dir.join("trace.json"));
        let mut t = sample();
        t.report = Report::Json(json.clone());
        t.trace = Some(trace.clone());
        t.finish();
        assert!(json_valid(&std::fs::read_to_string(&json).unwrap()));
        assert!(json_valid(&std::fs::read_to_string(&trace).unwrap()));
        std::fs::remove_file(&json).unwrap();
        t.finish();
        assert!(!json.exists(), "a second finish wrote again");
        // A path that cannot be written is logged, not a panic.
        let mut bad = Telemetry::with_outputs(false, Some(dir.join("no/such/dir/x.json")), None);
        bad.finish();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn enabled_by_outputs_or_by_hand() {
        assert!(!Telemetry::with_outputs(false, None, None).enabled());
        assert!(Telemetry::with_outputs(true, None, None).enabled());
        assert!(Telemetry::with_outputs(false, None, Some("x.json".into())).enabled());
        let mut t = Telemetry::with_outputs(false, None, None);
        t.set_enabled(true);
        assert!(t.enabled());
    }
}
