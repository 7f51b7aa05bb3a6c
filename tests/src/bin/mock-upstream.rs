//! The e2e tests' mock upstream as a process, for benchmarks: answers every request with the
//! same short text (both wire formats, JSON or SSE) and keeps no record of them.
//!
//! usage: mock-upstream [--listen ADDR] [--chunk-delay-ms N]
//!                      [--manifests-out DIR --provider anthropic|openai|azure-openai|bedrock|gemini|vertex [--http2 true]]
//!
//! Prints `ready url=http://ADDR` once it listens (HTTP/1.1, and HTTP/2 with prior knowledge).
//! With `--manifests-out`, it first writes a manifest folder there routing every model to
//! itself through that adapter, over cleartext HTTP/2 with `--http2 true`.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use e2e::upstream::{
    write_routed_manifests, MockUpstream, Reply, Unscripted, UpstreamDef, PROVIDERS,
};

/// The benchmark reply: about as long as the simulated provider's answer to "ping".
const TEXT: &str = "This is a reply from the mock upstream to ping.";

#[tokio::main]
async fn main() -> Result<()> {
    let mut listen = "127.0.0.1:0".to_owned();
    let mut delay = 0;
    let mut manifests = None;
    let mut provider = "anthropic".to_owned();
    let mut http2 = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => listen = value,
            "--chunk-delay-ms" => delay = value.parse()?,
            "--manifests-out" => manifests = Some(std::path::PathBuf::from(value)),
            "--provider" => provider = value,
            "--http2" => http2 = value.parse()?,
            other => bail!("unknown flag {other}"),
        }
    }
    let reply = Reply::text(TEXT).chunk_delay(Duration::from_millis(delay));
    let mock = MockUpstream::serve(&listen, Unscripted::Always(reply), false).await;
    if let Some(dir) = manifests {
        if !PROVIDERS.contains(&provider.as_str()) {
            bail!("unknown provider {provider}");
        }
        let upstream = UpstreamDef::of(&provider, &mock).timeouts(60_000, 60_000);
        let upstream = if http2 { upstream.http2() } else { upstream };
        write_routed_manifests(&dir, &[upstream]);
    }
    println!("ready url={}", mock.url);
    tokio::signal::ctrl_c().await?;
    Ok(())
}
