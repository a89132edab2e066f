//! Helpers for collectors: one metric family per call, written through `prometheus_client`'s
//! encoder (which adds `_total` to counters and the unit to names).

use crate::LatencyHistogram;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::fmt::Result;

/// Labels of one sample: `(name, value)` pairs.
pub type Labels = Vec<(&'static str, String)>;

/// A counter without labels: `NAME[_UNIT]_total`.
pub fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    value: u64,
) -> Result {
    let metric = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    ConstCounter::new(value).encode(metric)
}

/// A gauge without labels.
pub fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    value: i64,
) -> Result {
    let metric = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    ConstGauge::new(value).encode(metric)
}

/// A counter family: one sample per label set.
pub fn counters(
    encoder: &mut DescriptorEncoder,
    (name, help, unit): (&str, &str, Option<Unit>),
    samples: &[(Labels, u64)],
) -> Result {
    let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    for (labels, value) in samples {
        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A gauge family: one sample per label set.
pub fn gauges(
    encoder: &mut DescriptorEncoder,
    (name, help, unit): (&str, &str, Option<Unit>),
    samples: &[(Labels, i64)],
) -> Result {
    let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A histogram family in seconds: one histogram per label set.
pub fn histograms(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    samples: &[(Labels, &LatencyHistogram)],
) -> Result {
    let mut family = encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    for (labels, histogram) in samples {
        histogram.encode(&mut family.encode_family(labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;

    #[derive(Debug, Default)]
    struct Example(LatencyHistogram);

    impl Collector for Example {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result {
            counter(&mut encoder, "moved", "Bytes moved.", Some(Unit::Bytes), 42)?;
            let labels = vec![("kind", "read".to_string())];
            histograms(&mut encoder, ("latency", "Latency."), &[(labels, &self.0)])
        }
    }

    #[test]
    fn collectors_write_prometheus_names_and_units() {
        let example = Example::default();
        example.0.observe(std::time::Duration::from_millis(3));
        let mut registry = Registry::with_prefix("flotilla");
        registry.register_collector(Box::new(example));
        let text = crate::render(&registry);
        assert!(text.contains("flotilla_moved_bytes_total 42"), "{text}");
        assert!(text.contains("flotilla_latency_seconds_count{kind=\"read\"} 1"), "{text}");
        assert!(text.contains("flotilla_latency_seconds_bucket{le=\"0.005\",kind=\"read\"} 1"), "{text}");
    }
}
