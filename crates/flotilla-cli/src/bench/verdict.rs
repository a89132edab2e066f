//! Verdicts of `flotilla bench paper`: each finding of a paper carries a [`Rule`] written
//! beside it, and our measured ratio is judged by that rule alone (pure logic, no I/O).
//!
//! A rule states the paper's *direction* (our ratio above 1, below 1, or near 1 when the paper
//! reports no effect), a *no-effect band* (a ratio within `1 ± no_effect` is no effect at all,
//! so "asynchronous over synchronous: paper 1.55, ours 1.00" is judged `NO EFFECT`, not
//! agreeing), and a *tolerance* on the magnitude: a factor on the ratio itself for large
//! effects (Galley's 98×: ours within 2× of it) or a factor on the effect size for small ones
//! (a 10% loss against our 20%: effect within 2×).

use std::fmt;

/// Which way the paper's effect goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Direction {
    /// Ours must be above `1 + no_effect`.
    Above,
    /// Ours must be below `1 / (1 + no_effect)`.
    Below,
    /// The paper reports no effect: ours must lie within `1 ± band`.
    Near,
}

/// How close our magnitude must be to the paper's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// `ours / paper` within `[1/f, f]`.
    Ratio(f64),
    /// The effect sizes `ln(ours) / ln(paper)` within `[1/f, f]`.
    Effect(f64),
}

/// The rule a finding is judged by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    pub direction: Direction,
    /// Relative band around 1 inside which there is no effect (0.1: 0.91..1.10).
    pub no_effect: f64,
    pub tolerance: Tolerance,
    /// The direction is asserted by `--check` (CI): set where the finding holds here.
    pub checked: bool,
}

/// What a rule says of our ratio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Direction and magnitude both agree.
    Agrees,
    /// The direction agrees, the magnitude is outside the tolerance.
    DirectionOnly,
    /// The paper has an effect; ours is inside the no-effect band.
    NoEffect,
    /// The effect goes the other way (or, for a `Near` rule, there is an effect).
    Differs,
    /// Nothing measured (a zero or non-finite ratio).
    Missing,
}

impl Verdict {
    /// Whether the direction (the finding's sign) holds.
    pub fn direction_holds(self) -> bool {
        matches!(self, Verdict::Agrees | Verdict::DirectionOnly)
    }

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::DirectionOnly => "direction only",
            Verdict::NoEffect => "NO EFFECT",
            Verdict::Differs => "DIFFERS",
            Verdict::Missing => "MISSING",
        }
    }
}

impl Rule {
    /// The paper's ratio is above 1: ours must exceed `1 + no_effect`, its magnitude within
    /// the tolerance.
    pub const fn above(no_effect: f64, tolerance: Tolerance) -> Rule {
        Rule { direction: Direction::Above, no_effect, tolerance, checked: false }
    }

    /// The paper's ratio is below 1.
    pub const fn below(no_effect: f64, tolerance: Tolerance) -> Rule {
        Rule { direction: Direction::Below, no_effect, tolerance, checked: false }
    }

    /// The paper reports no effect (or one smaller than `band`).
    pub const fn near(band: f64) -> Rule {
        Rule {
            direction: Direction::Near,
            no_effect: band,
            tolerance: Tolerance::Ratio(1.0 + band),
            checked: false,
        }
    }

    /// The same rule, asserted by `--check`.
    pub const fn checked(self) -> Rule {
        Rule { checked: true, ..self }
    }

    /// The rule for a paper's ratio: its direction with a 10% no-effect band, the magnitude
    /// within 2× (of the ratio when it is 2 or more, of the effect otherwise).
    pub fn standard(paper_ratio: f64) -> Rule {
        let tolerance = if paper_ratio >= 2.0 || paper_ratio <= 0.5 {
            Tolerance::Ratio(2.0)
        } else {
            Tolerance::Effect(2.0)
        };
        if paper_ratio >= 1.1 {
            Rule::above(0.1, tolerance)
        } else if paper_ratio <= 1.0 / 1.1 {
            Rule::below(0.1, tolerance)
        } else {
            Rule::near(0.1)
        }
    }

    /// Judges our ratio against the paper's by this rule.
    pub fn judge(&self, paper_ratio: f64, ours: f64) -> Verdict {
        if !ours.is_finite() || ours <= 0.0 {
            return Verdict::Missing;
        }
        let high = 1.0 + self.no_effect;
        let low = 1.0 / high;
        let (right_side, no_effect) = match self.direction {
            Direction::Near => {
                let near = ours >= 1.0 - self.no_effect && ours <= high;
                return if near { Verdict::Agrees } else { Verdict::Differs };
            }
            Direction::Above => (ours >= high, ours > low),
            Direction::Below => (ours <= low, ours < high),
        };
        if !right_side {
            return if no_effect { Verdict::NoEffect } else { Verdict::Differs };
        }
        let within = |f: f64, x: f64| x >= 1.0 / f && x <= f;
        let magnitude = match self.tolerance {
            Tolerance::Ratio(f) => paper_ratio > 0.0 && within(f, ours / paper_ratio),
            Tolerance::Effect(f) => {
                let paper_effect = paper_ratio.ln();
                paper_effect != 0.0 && within(f, ours.ln() / paper_effect)
            }
        };
        if magnitude {
            Verdict::Agrees
        } else {
            Verdict::DirectionOnly
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let band = self.no_effect * 100.0;
        match self.direction {
            Direction::Near => return write!(f, "=1 ±{band:.0}%"),
            Direction::Above => write!(f, ">1 +{band:.0}%")?,
            Direction::Below => write!(f, "<1 -{band:.0}%")?,
        }
        match self.tolerance {
            Tolerance::Ratio(x) => write!(f, ", x{x}"),
            Tolerance::Effect(x) => write!(f, ", effect x{x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_effect_is_not_agreement() {
        // The case of issue 35: paper 1.55, ours 1.00.
        let rule = Rule::standard(1.55);
        assert_eq!(rule.judge(1.55, 1.00), Verdict::NoEffect);
        assert_eq!(rule.judge(1.55, 1.04), Verdict::NoEffect);
        assert!(!rule.judge(1.55, 1.00).direction_holds());
        assert_eq!(rule.judge(1.55, 1.5), Verdict::Agrees);
    }

    #[test]
    fn wrong_side_differs() {
        let rule = Rule::standard(1.55);
        assert_eq!(rule.judge(1.55, 0.7), Verdict::Differs);
        let below = Rule::standard(0.33);
        assert_eq!(below.judge(0.33, 1.5), Verdict::Differs);
        assert_eq!(below.judge(0.33, 0.98), Verdict::NoEffect);
        assert_eq!(below.judge(0.33, 0.3), Verdict::Agrees);
    }

    #[test]
    fn large_ratios_within_a_factor() {
        let rule = Rule::above(0.1, Tolerance::Ratio(2.0));
        assert_eq!(rule.judge(98.0, 60.0), Verdict::Agrees);
        assert_eq!(rule.judge(98.0, 196.0), Verdict::Agrees);
        assert_eq!(rule.judge(98.0, 40.0), Verdict::DirectionOnly);
        assert_eq!(rule.judge(98.0, 5.0), Verdict::DirectionOnly);
        assert!(rule.judge(98.0, 5.0).direction_holds());
    }

    #[test]
    fn small_effects_compare_effect_sizes() {
        // Paper: 10% slower (0.9). Ours 20% slower is within an effect factor of 2 (ln 0.8 /
        // ln 0.9 = 2.12, just outside), 15% slower is inside.
        let rule = Rule::below(0.03, Tolerance::Effect(2.0));
        assert_eq!(rule.judge(0.9, 0.85), Verdict::Agrees);
        assert_eq!(rule.judge(0.9, 0.8), Verdict::DirectionOnly);
        assert_eq!(rule.judge(0.9, 0.99), Verdict::NoEffect);
    }

    #[test]
    fn near_rules_want_no_effect() {
        let rule = Rule::near(0.05);
        assert_eq!(rule.judge(1.0, 1.03), Verdict::Agrees);
        assert_eq!(rule.judge(1.0, 0.96), Verdict::Agrees);
        assert_eq!(rule.judge(1.0, 1.2), Verdict::Differs);
        assert_eq!(rule.judge(1.0, 0.5), Verdict::Differs);
    }

    #[test]
    fn nothing_measured_is_missing() {
        let rule = Rule::standard(2.0);
        assert_eq!(rule.judge(2.0, 0.0), Verdict::Missing);
        assert_eq!(rule.judge(2.0, f64::NAN), Verdict::Missing);
        assert_eq!(rule.judge(2.0, f64::INFINITY), Verdict::Missing);
    }

    #[test]
    fn standard_rules_follow_the_paper() {
        assert_eq!(Rule::standard(98.0).direction, Direction::Above);
        assert_eq!(Rule::standard(0.6).direction, Direction::Below);
        assert_eq!(Rule::standard(0.95).direction, Direction::Near);
        assert_eq!(Rule::standard(1.02).direction, Direction::Near);
        assert!(!Rule::standard(2.0).checked);
        assert!(Rule::standard(2.0).checked().checked);
    }
}
