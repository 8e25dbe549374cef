//! Which weights RFHYBRID keeps in VRAM: each candidate's value per byte, and the choice within
//! the budget.

use crate::ggml_types::op;
use crate::tensor::Tensor;

/// A weight that could be kept in VRAM, and the time a byte of it saves there relative to
/// others (1: read whole by every graph; experts: the share of them a token reads).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub host: usize,
    pub len: usize,
    pub value: f64,
}

/// What a byte of source `i` of `n` is worth in VRAM: the experts of MUL_MAT_ID are read
/// sparsely (a token reads n_used of n_expert), everything else whole.
pub fn weight_value(n: &Tensor, i: usize) -> f64 {
    if n.op() == op::MUL_MAT_ID && i == 0 {
        let experts = n.src(0).map_or(1, |w| w.ne()[2].max(1));
        let used = n.src(2).map_or(1, |ids| ids.ne()[0].max(1));
        (used as f64 / experts as f64).min(1.0)
    } else {
        1.0
    }
}

/// The weights to keep in VRAM within `room` bytes: the most valuable per byte first, and
/// within one value in graph order, stopping at the first that does not fit (a split model's
/// first layers, contiguous) before trying the next value (dense weights of every layer before
/// any experts: what --cpu-moe does by hand).
pub fn choose_resident(candidates: &[Candidate], room: &mut usize) -> Vec<Candidate> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| {
        candidates[b]
            .value
            .total_cmp(&candidates[a].value)
            .then(a.cmp(&b))
    });
    let mut out = Vec::new();
    let mut full_at: Option<f64> = None;
    for i in order {
        let c = candidates[i];
        if full_at == Some(c.value) || out.iter().any(|o: &Candidate| o.host == c.host) {
            continue;
        }
        if c.len > *room {
            full_at = Some(c.value);
            continue;
        }
        *room -= c.len;
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(host: usize, len: usize, value: f64) -> Candidate {
        Candidate { host, len, value }
    }

    /// Dense weights of every layer before any experts; within a value, graph order up to the
    /// first that does not fit; a weight used twice is counted once.
    #[test]
    fn dense_first_then_experts_in_graph_order() {
        let cands = [
            c(0, 10, 1.0),
            c(100, 40, 8.0 / 128.0),
            c(200, 10, 1.0),
            c(300, 40, 8.0 / 128.0),
            c(0, 10, 1.0),
            c(400, 10, 1.0),
        ];
        let mut room = 75;
        let got: Vec<usize> = choose_resident(&cands, &mut room)
            .iter()
            .map(|c| c.host)
            .collect();
        assert_eq!(got, vec![0, 200, 400, 100]);
        assert_eq!(room, 5);
        // A dense weight that does not fit stops the dense ones (no later layer's pieces).
        let cands = [
            c(0, 10, 1.0),
            c(100, 50, 1.0),
            c(200, 10, 1.0),
            c(300, 5, 0.5),
        ];
        let mut room = 30;
        let got: Vec<usize> = choose_resident(&cands, &mut room)
            .iter()
            .map(|c| c.host)
            .collect();
        assert_eq!(got, vec![0, 300]);
        let mut room = 0;
        assert!(choose_resident(&cands, &mut room).is_empty());
    }

    #[test]
    fn experts_are_worth_the_share_a_token_reads() {
        use crate::ggml_types::GgmlType;
        use crate::hybrid::synth::Synth;
        let w = Synth::new(GgmlType::Q4_0, [256, 64, 128, 1]);
        let x = Synth::new(GgmlType::F32, [256, 8, 1, 1]);
        let ids = Synth::new(GgmlType::I32, [8, 1, 1, 1]);
        let mut n = Synth::new(GgmlType::F32, [64, 8, 1, 1]);
        n.op(op::MUL_MAT_ID).src(0, &w).src(1, &x).src(2, &ids);
        assert_eq!(weight_value(&n.tensor(), 0), 8.0 / 128.0);
        let mut m = Synth::new(GgmlType::F32, [64, 8, 1, 1]);
        m.op(op::MUL_MAT).src(0, &w).src(1, &x);
        assert_eq!(weight_value(&m.tensor(), 0), 1.0);
    }
}
