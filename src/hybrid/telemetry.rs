//! What RFHYBRID ran where: one `ExecutionEvent` per node and per transfer, `BackendStats` per
//! device, a summary table, JSON and a Chrome trace (ROCMFORGE_TELEMETRY, ROCMFORGE_TRACE).
//! (Interface; the reports are filled in by their own commit.)

use super::Place;

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

pub struct Telemetry {
    pub events: Vec<ExecutionEvent>,
    epoch: std::time::Instant,
}

impl Telemetry {
    /// Per ROCMFORGE_TELEMETRY / ROCMFORGE_TRACE.
    pub fn from_tuning() -> Telemetry {
        Telemetry {
            events: Vec::new(),
            epoch: std::time::Instant::now(),
        }
    }

    /// Whether events are being recorded.
    pub fn enabled(&self) -> bool {
        false
    }

    /// Turns recording on or off (from C).
    pub fn set_enabled(&mut self, _on: bool) {}

    /// µs since the telemetry began (for `start_us`).
    pub fn now_us(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1e6
    }

    pub fn record(&mut self, ev: ExecutionEvent) {
        self.events.push(ev);
    }

    pub fn stats(&self, _place: Place) -> BackendStats {
        BackendStats::default()
    }

    /// A table: ops by type and device, time and share per device, transfers, prediction error.
    pub fn execution_summary(&self) -> String {
        String::new()
    }

    /// `{"events":[...],"stats":{...}}`.
    pub fn to_json(&self) -> String {
        "{\"events\":[],\"stats\":{}}".into()
    }

    /// Chrome trace-event JSON (one track per device and one for transfers).
    pub fn chrome_trace(&self) -> String {
        "{\"traceEvents\":[]}".into()
    }

    /// At backend free: prints the summary / writes the files the knobs asked for.
    pub fn finish(&mut self) {}
}
