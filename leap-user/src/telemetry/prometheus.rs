//! The Prometheus text exposition (version 0.0.4) of a node's telemetry,
//! encoded by `prometheus-client`, which also escapes label values.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;
use serde_json::Value;

use super::{BUCKETS_US, Server, Telemetry};
use crate::transport::BackendCounters;

/// The `Content-Type` of what [`encode`] returns.
pub(super) const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// One scrape's values, taken at once so that they agree with each other.
#[derive(Debug)]
struct Scrape {
    json: Value,
    backend: Option<BackendCounters>,
    latency_counts: Vec<u64>,
    latency_sum_ns: u64,
    refused: [(&'static str, u64); 2],
}

/// Everything in `tel`, with the labels `node`, `role` and `transport` on
/// every sample.
pub(super) fn encode(tel: &Telemetry) -> String {
    let snap = tel.snapshot();
    let (latency_counts, latency_sum_ns) = tel.latency.snapshot();
    let scrape = Scrape {
        json: tel.json_of(&snap),
        backend: snap.backend,
        latency_counts,
        latency_sum_ns,
        refused: Server::ALL.map(|s| (s.name(), tel.refused(s))),
    };
    let labels = [("node", &tel.node), ("role", &tel.role), ("transport", &tel.transport)];
    let mut registry = Registry::with_labels(labels.into_iter().map(|(k, v)| (k.into(), v.clone().into())));
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    if let Err(e) = prometheus_text::encode(&mut out, &registry) {
        // Writing into a String does not fail; a metric the encoder rejects
        // would be a bug here, and a partial page beats none.
        log::error!("encoding metrics: {e}");
    }
    out
}

fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> std::fmt::Result {
    let c = ConstCounter::new(value);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

/// A counter family with one label, `key`.
fn family<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    key: &str,
    values: impl IntoIterator<Item = (&'a str, u64)>,
) -> std::fmt::Result {
    let mut metric = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (label, v) in values {
        let c = ConstCounter::new(v);
        c.encode(metric.encode_family(&[(key, label)])?)?;
    }
    Ok(())
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let j = &self.json;
        counter(&mut enc, "leap_frames", "Frames handled by this node's loop.", j["frames"].as_u64().unwrap_or(0))?;
        if let Some(stats) = j["stats"].as_object() {
            for (k, v) in stats {
                if let Some(n) = v.as_u64() {
                    counter(&mut enc, &format!("leap_{k}"), &format!("Transport counter {k}."), n)?;
                }
            }
            if let Some(drops) = stats.get("drops").and_then(Value::as_object) {
                let values = drops.iter().map(|(k, v)| (k.as_str(), v.as_u64().unwrap_or(0)));
                family(&mut enc, "leap_drops", "Datagrams dropped, by reason.", "reason", values)?;
            }
        }
        if let Some(backend) = &self.backend {
            family(
                &mut enc,
                "leap_backend",
                "Counters of the XDP program or kernel module.",
                "counter",
                backend.values(),
            )?;
        }
        family(
            &mut enc,
            "leap_telemetry_refused_connections",
            "Connections to /metrics or the stats socket closed for being over the limit.",
            "server",
            self.refused,
        )?;
        let buckets: Vec<(f64, u64)> = self
            .latency_counts
            .iter()
            .enumerate()
            .map(|(i, &c)| (BUCKETS_US.get(i).map_or(f64::INFINITY, |b| b / 1e6), c))
            .collect();
        let mut metric = enc.encode_descriptor(
            "leap_latency_seconds",
            "Head: round trip; worker: receive to forwarded.",
            None,
            MetricType::Histogram,
        )?;
        let count = self.latency_counts.iter().sum();
        metric.encode_histogram::<NoLabelSet>(self.latency_sum_ns as f64 / 1e9, count, &buckets, None)
    }
}
