//! Slow, half-sent and idle connections: a request head must arrive within
//! `--header-read-timeout-secs` (idle keep-alive connections too), a body at the minimum rate
//! past `--body-read-timeout-secs` (else 408), and the public listener holds at most
//! `--max-connections` (lowered to leave file descriptors free), so thousands of slow sockets
//! neither exhaust the gateway's files nor keep a real client or a probe out. Bounded in count
//! and time; loopback only.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use e2e::response::assert_envelope;
use e2e::*;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Slow sockets opened: more than the gateway's open file limit below.
const SLOW_SOCKETS: usize = 1_500;
/// The gateway's open file limit in the flood test (`ulimit -n`).
const GATEWAY_FILES: u64 = 1_024;
/// Generous "no hang" bound; the time taken is a benchmark figure, not an assertion.
const NO_HANG: Duration = Duration::from_secs(60);

fn addr(base: &str) -> SocketAddr {
    base.trim_start_matches("http://")
        .parse()
        .expect("a socket address")
}

async fn short_timeouts() -> Gateway {
    Gateway::builder()
        .arg("--header-read-timeout-secs")
        .arg("2")
        .arg("--body-read-timeout-secs")
        .arg("2")
        .arg("--body-min-bytes-per-sec")
        .arg("1024")
        .start()
        .await
}

/// Reads until the server closes the connection (or `NO_HANG` passes); returns what it sent.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(NO_HANG, stream.read_to_end(&mut buf)).await;
    assert!(
        read.is_ok(),
        "the gateway kept a slow connection open past {NO_HANG:?}"
    );
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test]
async fn a_half_sent_request_head_is_cut_after_the_header_read_timeout() {
    let gw = short_timeouts().await;
    let mut stream = TcpStream::connect(addr(&gw.api)).await.expect("connect");
    stream
        .write_all(b"POST /v1/messages HTTP/1.1\r\nhost: gateway\r\n")
        .await
        .expect("write");
    read_to_close(&mut stream).await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_read_timeout() {
    let gw = short_timeouts().await;
    let mut stream = TcpStream::connect(addr(&gw.api)).await.expect("connect");
    let request = format!(
        "GET /v1/models HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {}\r\n\r\n",
        gw.key
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let answer = read_to_close(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_body_slower_than_the_minimum_rate_is_408_in_the_error_envelope() {
    let gw = short_timeouts().await;
    let mut stream = TcpStream::connect(addr(&gw.api)).await.expect("connect");
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: 100000\r\n\r\n{{\"model\":",
        gw.key
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    let answer = read_to_close(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let text = body.lines().find(|l| l.starts_with('{')).unwrap_or(body);
    assert_envelope(text);
}

/// One slow socket of each kind in turn: a half-sent head, a half-sent body, an idle
/// connection. `None` when the connection could not be made (the backlog is full).
async fn slow_socket(api: SocketAddr, i: usize, key: String) -> Option<TcpStream> {
    let mut stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(api))
        .await
        .ok()?
        .ok()?;
    let sent = match i % 3 {
        0 => "POST /v1/messages HTTP/1.1\r\nhost: gateway\r\n".to_string(),
        1 => format!(
            "POST /v1/messages HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {key}\r\n\
             content-type: application/json\r\ncontent-length: 100000\r\n\r\n{{"
        ),
        _ => String::new(),
    };
    stream.write_all(sent.as_bytes()).await.ok()?;
    Some(stream)
}

#[tokio::test]
async fn a_real_client_and_the_probes_are_served_while_thousands_of_slow_sockets_are_open() {
    let gw = Gateway::builder()
        .max_open_files(GATEWAY_FILES)
        .arg("--header-read-timeout-secs")
        .arg("2")
        .arg("--body-read-timeout-secs")
        .arg("2")
        .start()
        .await;
    let api = addr(&gw.api);
    // The slow clients' own key: their half-sent bodies count against its RPM, not the real
    // client's.
    let key = gw.new_key(0, &KeySpec::tier("free")).await.secret;
    let slow: Vec<TcpStream> = futures::stream::iter(0..SLOW_SOCKETS)
        .map(|i| slow_socket(api, i, key.clone()))
        .buffer_unordered(256)
        .filter_map(|s| async move { s })
        .collect()
        .await;
    assert!(
        slow.len() > GATEWAY_FILES as usize,
        "only {} slow sockets connected",
        slow.len()
    );

    let started = Instant::now();
    let probe = tokio::time::timeout(NO_HANG, gw.admin_unauthenticated("/livez")).await;
    let probe_ms = started.elapsed().as_millis();
    probe.expect("the liveness probe hung").expect_status(200);

    let started = Instant::now();
    let real = tokio::time::timeout(
        NO_HANG,
        gw.post_messages(&gw.key, &message("svc/haiku", "still there?", 16)),
    )
    .await;
    let real_ms = started.elapsed().as_millis();
    real.expect("the real client hung").expect_ok();
    eprintln!(
        "benchmark: {} slow sockets open, gateway ulimit -n {GATEWAY_FILES}: /livez {probe_ms} ms, \
         POST /v1/messages {real_ms} ms",
        slow.len()
    );
    drop(slow);
}
