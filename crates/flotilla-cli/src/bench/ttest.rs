//! The unpaired-observations *t*-test of GFS-GROUP's Table 2 (Student's, pooled variance,
//! two-sided, 95% confidence): whether two programs' timings differ significantly. Pure
//! logic, no I/O.

/// Two-sided 95% critical values of Student's t for 1..=30 degrees of freedom.
const T_CRITICAL_95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
];

/// The two-sided 95% critical value for `df` degrees of freedom (`df` ≥ 1); past 30 the
/// tabled values at 40, 60 and 120, then the normal's 1.96.
fn t_critical_95(df: usize) -> f64 {
    match df {
        0 => f64::INFINITY,
        1..=30 => T_CRITICAL_95[df - 1],
        31..=40 => 2.021,
        41..=60 => 2.000,
        61..=120 => 1.980,
        _ => 1.960,
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Sum of squared deviations from the mean.
fn squares(xs: &[f64]) -> f64 {
    let m = mean(xs);
    xs.iter().map(|x| (x - m) * (x - m)).sum()
}

/// Whether the means of `a` and `b` differ at the 95% level; `None` when either sample has
/// fewer than two observations (no variance to test against).
pub fn differs_95(a: &[f64], b: &[f64]) -> Option<bool> {
    if a.len() < 2 || b.len() < 2 || a.iter().chain(b).any(|x| !x.is_finite()) {
        return None;
    }
    let df = a.len() + b.len() - 2;
    let pooled = (squares(a) + squares(b)) / df as f64;
    let spread = (pooled * (1.0 / a.len() as f64 + 1.0 / b.len() as f64)).sqrt();
    let gap = (mean(a) - mean(b)).abs();
    if spread == 0.0 {
        return Some(gap > 0.0);
    }
    Some(gap / spread > t_critical_95(df))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_separated_samples_differ() {
        assert_eq!(differs_95(&[10.0, 10.2, 9.9], &[12.0, 12.1, 11.8]), Some(true));
    }

    #[test]
    fn overlapping_samples_do_not() {
        assert_eq!(differs_95(&[10.0, 11.0, 9.0], &[10.5, 9.5, 11.5]), Some(false));
    }

    #[test]
    fn the_threshold_is_the_tabled_t() {
        // Means 0 and d, each sample {m - 1, m + 1}: pooled variance 2, spread sqrt(2) · 1 =
        // 1.414…, df 2, critical 4.303: significant only past d = 6.085.
        let at = |d: f64| differs_95(&[-1.0, 1.0], &[d - 1.0, d + 1.0]);
        assert_eq!(at(6.0), Some(false));
        assert_eq!(at(6.2), Some(true));
    }

    #[test]
    fn one_observation_cannot_be_tested() {
        assert_eq!(differs_95(&[1.0], &[2.0, 3.0]), None);
        assert_eq!(differs_95(&[], &[]), None);
        assert_eq!(differs_95(&[1.0, f64::NAN], &[2.0, 3.0]), None);
    }

    #[test]
    fn identical_constant_samples_do_not_differ_and_distinct_ones_do() {
        assert_eq!(differs_95(&[2.0, 2.0], &[2.0, 2.0]), Some(false));
        assert_eq!(differs_95(&[2.0, 2.0], &[3.0, 3.0]), Some(true));
    }

    #[test]
    fn large_samples_use_the_normal_limit() {
        assert!((t_critical_95(1000) - 1.96).abs() < 1e-9);
        assert!(t_critical_95(30) > t_critical_95(31) && t_critical_95(31) > t_critical_95(200));
    }
}
