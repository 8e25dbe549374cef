//! Two plans of one graph measured against each other. The cost model's online corrections
//! come from nodes timed alone, and on a busy host those vary: on the H100 (2026-11-26) one
//! RFHYBRID process in three or four planned its 8B tokens at half the weights with 2 GB
//! streamed to the GPU per token (18-27 t/s) instead of the CPU products beside prefetch groups
//! (37-42 t/s), because a prompt's few CPU products, timed alone, had set every token product's
//! correction 2-10x too slow. Each plan was the cheapest under the model it was made with, so
//! no prediction tells them apart; running them does.
//!
//! When a new graph's plan differs from the plan the calibrated curves alone give (no online
//! corrections), both are candidates. They take turns in the order first, second, second,
//! first, `WINDOW` measured runs a turn (the first run after each swap left out: it builds
//! shadows and captures), so that a host drifting steadily over the first tokens counts against
//! both alike; the graph keeps the one with the lower median over its turns. Another graph in between ends the trial with the plan
//! the graph has. A graph that runs fewer times (a prompt) keeps its first plan.

/// Measured runs per turn (`start`'s default).
pub const WINDOW: usize = 4;
/// Which candidate each turn runs (0: the first).
const ORDER: [usize; 4] = [0, 1, 1, 0];

/// What the caller does after a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Keep running the plan it has.
    Stay,
    /// Swap to the other candidate; the trial goes on.
    Swap,
    /// The trial is over and the candidate in place (the first) was the faster: drop the other.
    Keep,
    /// The trial is over and the other candidate was the faster: swap to it, drop this one.
    SwapBack,
}

/// The trial of the graph computed last, if one runs (the caller stops it when another graph
/// comes).
#[derive(Default)]
pub struct PlanTrial {
    active: bool,
    /// The turn running (an index into ORDER).
    turn: usize,
    /// Runs of the current turn, and whether its first is left out (after a swap).
    runs: usize,
    warm: bool,
    /// Measured runs per turn.
    window: usize,
    /// Measured runs of each candidate.
    times: [Vec<f64>; 2],
}

pub fn median(v: &[f64]) -> f64 {
    let mut r = v.to_vec();
    r.sort_by(f64::total_cmp);
    match r.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => r[n / 2],
        n => 0.5 * (r[n / 2 - 1] + r[n / 2]),
    }
}

impl PlanTrial {
    /// Starts a trial (the first candidate in place) of `window` measured runs a turn,
    /// replacing any other.
    pub fn start(&mut self, window: usize) {
        *self = PlanTrial {
            active: true,
            warm: true,
            window: window.max(1),
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
        if (self.warm && self.runs == 1) || !us.is_finite() {
            return Step::Stay;
        }
        self.times[ORDER[self.turn]].push(us);
        if self.runs < self.window + self.warm as usize {
            return Step::Stay;
        }
        self.runs = 0;
        self.turn += 1;
        if self.turn < ORDER.len() {
            self.warm = ORDER[self.turn] != ORDER[self.turn - 1];
            return if self.warm { Step::Swap } else { Step::Stay };
        }
        // The last turn ran the first candidate.
        let second_faster = median(&self.times[1]) < median(&self.times[0]);
        self.stop();
        if second_faster {
            Step::SwapBack
        } else {
            Step::Keep
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Step::*;

    /// A turn after a swap: the left-out run, then WINDOW runs at `us`; the last run's step.
    fn turn(t: &mut PlanTrial, us: f64) -> Step {
        assert_eq!(t.ran(1e9), Stay, "the first run after a swap is left out");
        same_turn(t, us)
    }

    /// A turn without a swap before it: WINDOW runs at `us`; the last run's step.
    fn same_turn(t: &mut PlanTrial, us: f64) -> Step {
        for _ in 0..WINDOW - 1 {
            assert_eq!(t.ran(us), Stay);
        }
        t.ran(us)
    }

    #[test]
    fn turns_go_first_second_second_first_and_the_faster_is_kept() {
        let mut t = PlanTrial::default();
        assert_eq!(t.ran(1.0), Stay, "no trial");
        // The second is faster: swapped to at the end.
        t.start(WINDOW);
        assert_eq!(turn(&mut t, 100.0), Swap);
        assert_eq!(turn(&mut t, 90.0), Stay);
        assert_eq!(same_turn(&mut t, 90.0), Swap);
        assert_eq!(turn(&mut t, 100.0), SwapBack);
        assert!(!t.running());
        assert_eq!(t.ran(1.0), Stay);
        // The first is faster: kept.
        t.start(WINDOW);
        assert_eq!(turn(&mut t, 100.0), Swap);
        assert_eq!(turn(&mut t, 130.0), Stay);
        assert_eq!(same_turn(&mut t, 130.0), Swap);
        assert_eq!(turn(&mut t, 100.0), Keep);
        assert!(!t.running());
    }

    #[test]
    fn steady_drift_counts_against_both() {
        // The host slows by 30% a turn: the second candidate, 5% faster than the first at any
        // point in time, wins although the first ran first (first, second, first, second
        // would have kept the first: medians 130 against 152).
        let mut t = PlanTrial::default();
        t.start(WINDOW);
        let at = |k: usize| 100.0 * (1.0 + 0.3 * k as f64);
        assert_eq!(turn(&mut t, at(0)), Swap);
        assert_eq!(turn(&mut t, 0.95 * at(1)), Stay);
        assert_eq!(same_turn(&mut t, 0.95 * at(2)), Swap);
        assert_eq!(turn(&mut t, at(3)), SwapBack);
    }

    #[test]
    fn medians_not_means_and_stop() {
        let mut t = PlanTrial::default();
        t.start(WINDOW);
        t.ran(0.0);
        for us in [100.0, 100.0, 100.0] {
            t.ran(us);
        }
        // One slow run does not make the first lose.
        assert_eq!(t.ran(5000.0), Swap);
        turn(&mut t, 101.0);
        same_turn(&mut t, 101.0);
        assert_eq!(turn(&mut t, 100.0), Keep);
        t.start(WINDOW);
        t.stop();
        assert!(!t.running());
        assert_eq!(t.ran(1.0), Stay);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
