//! `service-model`: the model of the service's latency and limits, in front
//! of an upstream (Azurite), for `scripts/bench.sh --model`.
//!
//!   service-model --profile standard|p10|p30 --upstream HOST:PORT
//!                 [--listen ADDR:PORT] [--rtt-ms MS] [--jitter-ms MS]
//!                 [--queue-ms MS] [--trace FILE]
//!   service-model --profile NAME --describe
//!
//! Prints one JSON line once it listens (`listen`, `profile`), serves until
//! SIGTERM or SIGINT, then prints its counters as one JSON line. While it
//! runs, `GET /.model/stats` and `GET /.model/profile` on its port answer
//! the same. `--trace FILE` records every request, one line each
//! (`trace.rs`). Logs (`tracing`) go to stderr, filtered by
//! `SERVICE_MODEL_LOG` (default `info`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use service_model::{profile, Profile, ServiceModel};

struct Args {
    profile: Profile,
    upstream: Option<String>,
    listen: SocketAddr,
    describe: bool,
    trace: Option<std::path::PathBuf>,
}

fn millis(v: &str, flag: &str) -> anyhow::Result<Duration> {
    let ms: f64 = v
        .parse()
        .with_context(|| format!("{flag} wants milliseconds"))?;
    anyhow::ensure!(ms >= 0.0 && ms.is_finite(), "{flag} wants milliseconds");
    Ok(Duration::from_secs_f64(ms / 1e3))
}

fn parse_args() -> anyhow::Result<Args> {
    let mut profile = None;
    let (mut upstream, mut listen, mut describe, mut trace) = (None, None, false, None);
    let (mut rtt, mut jitter, mut queue) = (None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--describe" {
            describe = true;
            continue;
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--profile" => {
                profile = Some(Profile::named(&value).with_context(|| {
                    format!(
                        "no profile {value}; the profiles: {}",
                        profile::NAMES.join(", ")
                    )
                })?)
            }
            "--upstream" => upstream = Some(value),
            "--listen" => listen = Some(value.parse().context("--listen wants ADDR:PORT")?),
            "--rtt-ms" => rtt = Some(millis(&value, &flag)?),
            "--jitter-ms" => jitter = Some(millis(&value, &flag)?),
            "--queue-ms" => queue = Some(millis(&value, &flag)?),
            "--trace" => trace = Some(value.into()),
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    let mut profile = profile.context("--profile is required")?;
    if let Some(rtt) = rtt {
        profile.rtt = rtt;
    }
    if let Some(jitter) = jitter {
        profile.jitter = jitter;
    }
    if let Some(queue) = queue {
        profile.queue_bound = queue;
    }
    Ok(Args {
        profile,
        upstream,
        listen: listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
        describe,
        trace,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SERVICE_MODEL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = parse_args().map_err(|e| anyhow::anyhow!("service-model: {e:#}"))?;
    if args.describe {
        println!("{}", args.profile.to_json());
        return Ok(());
    }
    let upstream = args.upstream.context("--upstream HOST:PORT is required")?;
    let trace = match &args.trace {
        Some(path) => service_model::trace::Trace::to_file(path)
            .with_context(|| format!("create the trace {}", path.display()))?,
        None => service_model::trace::Trace::off(),
    };
    let model = ServiceModel::start_traced(args.listen, &upstream, args.profile, trace)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    println!(
        "{}",
        serde_json::json!({ "listen": model.addr().to_string(), "profile": model.profile().to_json() })
    );
    tracing::info!(listen = %model.addr(), %upstream, profile = %model.profile().name, "serving");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    println!("{}", model.stats());
    Ok(())
}
