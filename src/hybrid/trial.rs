//! Two plans of one graph measured against each other. The cost model's online corrections
//! come from nodes timed alone, and on a busy host those vary: on the H100 (2026-11-26) one
//! RFHYBRID process in three or four planned its 8B tokens at half the weights with 2 GB
//! streamed to the GPU per token (18-27 t/s) instead of the CPU products beside prefetch groups
//! (37-42 t/s), because a prompt's few CPU products, timed alone, had set every token product's
//! correction 2-10x too slow. Each plan was the cheapest under the model it was made with, so
//! no prediction tells them apart; running them does.
//!
//! When a new graph's plan differs from the plan the calibrated curves alone give (no online
//! corrections), both are candidates: the first runs `WINDOW` measured runs, then the second
//! (each plan's first run after a switch is left out: it builds its shadows and captures), and
//! the graph keeps the one with the lower median. Another graph in between ends the trial with
//! the plan the graph has. A graph that runs fewer times (a prompt) keeps its first plan.

/// Measured runs per candidate.
pub const WINDOW: usize = 4;

/// What the caller does after a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Keep running the plan it has.
    Stay,
    /// Swap to the other candidate (the trial's second half).
    TryOther,
    /// The trial is over: swap back to the first candidate, which was faster.
    Back,
}

/// The trial of the graph computed last, if one runs (the caller stops it when another graph
/// comes).
#[derive(Default)]
pub struct PlanTrial {
    active: bool,
    /// The first candidate's median once measured.
    first_us: Option<f64>,
    /// Runs of the current candidate since it was put in place (the first is left out).
    runs: usize,
    recent: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut r = v.to_vec();
    r.sort_by(f64::total_cmp);
    match r.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => r[n / 2],
        n => 0.5 * (r[n / 2 - 1] + r[n / 2]),
    }
}

impl PlanTrial {
    /// Starts a trial (the first candidate in place), replacing any other.
    pub fn start(&mut self) {
        *self = PlanTrial {
            active: true,
            ..PlanTrial::default()
        };
    }

    /// Ends any trial (the graph changed: the plan it has stays).
    pub fn stop(&mut self) {
        *self = PlanTrial::default();
    }

    /// Whether a trial runs.
    pub fn running(&self) -> bool {
        self.active
    }

    /// A run of the graph took `us`: what to do next.
    pub fn ran(&mut self, us: f64) -> Step {
        if !self.active {
            return Step::Stay;
        }
        self.runs += 1;
        if self.runs == 1 || !us.is_finite() {
            return Step::Stay;
        }
        self.recent.push(us);
        if self.recent.len() < WINDOW {
            return Step::Stay;
        }
        let m = median(&self.recent);
        self.recent.clear();
        self.runs = 0;
        match self.first_us {
            None => {
                self.first_us = Some(m);
                Step::TryOther
            }
            Some(first) => {
                self.stop();
                if m <= first {
                    Step::Stay
                } else {
                    Step::Back
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(t: &mut PlanTrial, us: f64, times: usize) -> Vec<Step> {
        (0..times).map(|_| t.ran(us)).collect()
    }

    #[test]
    fn the_faster_candidate_is_kept() {
        use Step::*;
        let mut t = PlanTrial::default();
        assert_eq!(
            run(&mut t, 1.0, 2 * WINDOW + 2),
            vec![Stay; 2 * WINDOW + 2],
            "no trial"
        );
        // The second is faster: it stays.
        t.start();
        // The first run after a switch is left out, then WINDOW measured.
        assert_eq!(run(&mut t, 1e6, 1), [Stay]);
        assert_eq!(run(&mut t, 100.0, WINDOW), [Stay, Stay, Stay, TryOther]);
        assert_eq!(run(&mut t, 1e6, 1), [Stay]);
        assert_eq!(run(&mut t, 90.0, WINDOW), [Stay, Stay, Stay, Stay]);
        assert!(!t.running());
        // The first is faster: back to it, once.
        t.start();
        run(&mut t, 100.0, WINDOW + 1);
        assert_eq!(run(&mut t, 130.0, WINDOW + 1).last(), Some(&Back));
        assert_eq!(
            run(&mut t, 130.0, 2 * WINDOW + 2),
            vec![Stay; 2 * WINDOW + 2]
        );
    }

    #[test]
    fn medians_not_means() {
        let mut t = PlanTrial::default();
        t.start();
        t.ran(0.0);
        for us in [100.0, 100.0, 100.0, 5000.0] {
            t.ran(us);
        }
        // One slow run among the second candidate's does not make it lose either.
        t.ran(0.0);
        for us in [99.0, 99.0, 99.0] {
            t.ran(us);
        }
        assert_eq!(t.ran(9000.0), Step::Stay);
        assert!(!t.running());
        // stop ends a trial.
        t.start();
        t.stop();
        assert!(!t.running());
        assert_eq!(
            run(&mut t, 1.0, 2 * WINDOW + 2),
            vec![Step::Stay; 2 * WINDOW + 2]
        );
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
