//! An OTLP/HTTP trace receiver on loopback, speaking `http/json`: the gateway under test
//! exports its spans here (`OTEL_EXPORTER_OTLP_ENDPOINT`), and tests read them back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One exported span, flattened out of its resource and scope.
#[derive(Clone, Debug)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    /// The span as received, for failure messages.
    pub raw: Value,
}

impl Span {
    /// An attribute's value as JSON (string, number, bool, or an array of them).
    pub fn attr(&self, key: &str) -> Option<Value> {
        self.raw["attributes"]
            .as_array()?
            .iter()
            .find(|a| a["key"] == key)
            .map(|a| any_value(&a["value"]))
    }

    pub fn str_attr(&self, key: &str) -> String {
        match self.attr(key) {
            Some(Value::String(s)) => s,
            other => panic!("{key} is {other:?} on {}", self.raw),
        }
    }

    pub fn int_attr(&self, key: &str) -> i64 {
        match self.attr(key) {
            Some(Value::Number(n)) => n.as_i64().unwrap_or_else(|| panic!("{key}: {n}")),
            other => panic!("{key} is {other:?} on {}", self.raw),
        }
    }
}

/// proto3 JSON: int64 values may come as strings.
fn any_value(v: &Value) -> Value {
    if let Some(s) = v.get("stringValue") {
        return s.clone();
    }
    if let Some(i) = v.get("intValue") {
        return match i {
            Value::String(s) => s.parse::<i64>().map(Value::from).unwrap_or(Value::Null),
            other => other.clone(),
        };
    }
    if let Some(b) = v.get("boolValue") {
        return b.clone();
    }
    if let Some(d) = v.get("doubleValue") {
        return d.clone();
    }
    if let Some(values) = v.get("arrayValue").and_then(|a| a["values"].as_array()) {
        return Value::Array(values.iter().map(any_value).collect());
    }
    Value::Null
}

pub struct OtlpReceiver {
    /// Base URL for `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter adds `/v1/traces`).
    pub endpoint: String,
    bodies: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind OTLP receiver");
        let endpoint = format!("http://{}", listener.local_addr().expect("local addr"));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let store = bodies.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(serve(tcp, store.clone()));
            }
        });
        OtlpReceiver {
            endpoint,
            bodies,
            task,
        }
    }

    /// Every export request body received so far, as text.
    pub fn raw(&self) -> Vec<String> {
        self.bodies.lock().expect("bodies").clone()
    }

    pub fn spans(&self) -> Vec<Span> {
        let mut out = Vec::new();
        for body in self.raw() {
            let export: Value = serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("export body is not JSON ({e}): {body}"));
            for resource in export["resourceSpans"].as_array().into_iter().flatten() {
                for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                    for span in scope["spans"].as_array().into_iter().flatten() {
                        let field = |k: &str| span[k].as_str().unwrap_or_default().to_string();
                        out.push(Span {
                            trace_id: field("traceId"),
                            span_id: field("spanId"),
                            parent_span_id: field("parentSpanId"),
                            name: field("name"),
                            raw: span.clone(),
                        });
                    }
                }
            }
        }
        out
    }

    /// Waits (at most 15 s) until a span matching `pred` has arrived, and returns it.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&Span) -> bool) -> Span {
        crate::poll_until(
            what,
            Duration::from_secs(15),
            Duration::from_millis(50),
            || {
                let found = self.spans().into_iter().find(|s| pred(s));
                async move { found }
            },
        )
        .await
    }

    /// The spans whose parent is `span`.
    pub fn children(&self, span: &Span) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id == span.trace_id && s.parent_span_id == span.span_id)
            .collect()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// HTTP/1.1 with keep-alive, `content-length` bodies: what the OTLP/HTTP exporters send.
async fn serve(tcp: TcpStream, store: Arc<Mutex<Vec<String>>>) {
    let (read, mut write) = tcp.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        store
            .lock()
            .expect("bodies")
            .push(String::from_utf8_lossy(&body).into_owned());
        let reply =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}
