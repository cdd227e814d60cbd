//! `GET /metrics`: the server's counters in Prometheus' text format, from
//! the `prometheus` crate (TiKV's client), named as vLLM's are where they
//! mean the same (`…_prompt_tokens_total`, `…_time_to_first_token_seconds`,
//! `…_time_per_output_token_seconds`), under the `r2vpo_` prefix.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use r2vpo_llm::engine::{EngineStats, TokenEvent, TokenSink};

/// Every metric the server exports, in one registry.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    running: IntGauge,
    waiting: IntGauge,
    batch_occupancy: prometheus::Gauge,
    ttft: Histogram,
    per_token: Histogram,
    weight_version: IntGaugeVec,
    pushes: IntCounterVec,
    /// The version last exported, so its old label is cleared.
    version: Mutex<String>,
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("a valid metric");
    r.register(Box::new(c.clone())).expect("registered once");
    c
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("a valid metric");
    r.register(Box::new(g.clone())).expect("registered once");
    g
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("a valid metric");
    r.register(Box::new(h.clone())).expect("registered once");
    h
}

impl Metrics {
    /// The metrics of a fresh server.
    pub fn new() -> Self {
        let r = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("r2vpo_http_requests_total", "HTTP requests answered, by route and status"),
            &["route", "status"],
        )
        .expect("a valid metric");
        r.register(Box::new(requests.clone())).expect("registered once");
        let weight_version = IntGaugeVec::new(
            Opts::new("r2vpo_weight_version_info", "1 for the weight version now serving"),
            &["version"],
        )
        .expect("a valid metric");
        r.register(Box::new(weight_version.clone())).expect("registered once");
        let pushes = IntCounterVec::new(
            Opts::new("r2vpo_weight_pushes_total", "Weight pushes (update_weights_from_disk), by result"),
            &["result"],
        )
        .expect("a valid metric");
        r.register(Box::new(pushes.clone())).expect("registered once");
        let batch_occupancy =
            prometheus::Gauge::new("r2vpo_batch_occupancy", "Running rows over the decode batch's capacity")
                .expect("a valid metric");
        r.register(Box::new(batch_occupancy.clone())).expect("registered once");
        let latency = vec![0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];
        Metrics {
            requests,
            prompt_tokens: counter(&r, "r2vpo_prompt_tokens_total", "Prompt tokens of admitted requests"),
            generation_tokens: counter(&r, "r2vpo_generation_tokens_total", "Tokens generated"),
            running: gauge(&r, "r2vpo_num_requests_running", "Rows being decoded"),
            waiting: gauge(&r, "r2vpo_num_requests_waiting", "Jobs waiting for admission"),
            batch_occupancy,
            ttft: histogram(
                &r,
                "r2vpo_time_to_first_token_seconds",
                "From a request's arrival to each sample's first token",
                latency.clone(),
            ),
            per_token: histogram(
                &r,
                "r2vpo_time_per_output_token_seconds",
                "Between consecutive tokens of one sample",
                latency,
            ),
            weight_version,
            pushes,
            version: Mutex::new(String::new()),
            registry: r,
        }
    }

    /// Counts an answered request.
    pub fn request(&self, route: &str, status: u16) {
        self.requests.with_label_values(&[route, &status.to_string()]).inc();
    }

    /// Counts the prompt tokens of an admitted request.
    pub fn prompt(&self, tokens: usize) {
        self.prompt_tokens.inc_by(tokens as u64);
    }

    /// Counts a weight push.
    pub fn push(&self, ok: bool) {
        self.pushes.with_label_values(&[if ok { "loaded" } else { "refused" }]).inc();
    }

    /// A sink for one job of `samples` samples that arrived at `arrival`:
    /// observes each sample's time to first token and the time between its
    /// tokens, then hands the event to `forward` (a streaming client), whose
    /// answer it returns.
    pub fn sink(
        self: &Arc<Self>,
        arrival: Instant,
        samples: usize,
        forward: Option<Arc<dyn Fn(TokenEvent) -> bool + Send + Sync>>,
    ) -> TokenSink {
        let me = self.clone();
        let last: Mutex<Vec<Option<Instant>>> = Mutex::new(vec![None; samples]);
        Arc::new(move |e: TokenEvent| {
            let now = Instant::now();
            if let Some(slot) = last.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_mut(e.sample) {
                match slot.replace(now) {
                    None => me.ttft.observe((now - arrival).as_secs_f64()),
                    Some(t) => me.per_token.observe((now - t).as_secs_f64()),
                }
            }
            forward.as_ref().is_none_or(|f| f(e))
        })
    }

    /// The text exposition, after reading the engine's gauges.
    pub fn render(&self, stats: &EngineStats, max_batch: usize) -> String {
        self.running.set(stats.running as i64);
        self.waiting.set(stats.waiting as i64);
        self.batch_occupancy.set(stats.running as f64 / max_batch.max(1) as f64);
        // A counter that follows the engine's own count.
        let generated = self.generation_tokens.get();
        self.generation_tokens.inc_by(stats.generated_tokens.saturating_sub(generated));
        let mut version = self.version.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *version != stats.weight_version {
            if !version.is_empty() {
                let _ = self.weight_version.remove_label_values(&[version.as_str()]);
            }
            self.weight_version.with_label_values(&[stats.weight_version.as_str()]).set(1);
            *version = stats.weight_version.clone();
        }
        drop(version);
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
