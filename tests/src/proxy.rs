//! A loopback TCP proxy between one process and a server, that a test can cut: a network
//! partition of that process alone. Cut, it forwards nothing and answers nothing (as a dead
//! link does, so the process waits out its own timeouts), on the connections it holds and on
//! new ones; restored, it closes those stalled connections and forwards new ones again.

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct TcpProxy {
    pub port: u16,
    cut: Arc<watch::Sender<bool>>,
    accepting: JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:target`.
    pub async fn start(target: u16) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = Arc::new(watch::channel(false).0);
        let watching = cut.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, target, watching.subscribe()));
            }
        });
        TcpProxy {
            port,
            cut,
            accepting,
        }
    }

    /// Cuts the link: nothing goes through until [`restore`](Self::restore).
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Forwards one connection until either side closes it, or stalls it while the link is cut
/// and closes it once the link is restored.
async fn forward(mut client: TcpStream, target: u16, mut cut: watch::Receiver<bool>) {
    if !*cut.borrow_and_update() {
        let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await else {
            return;
        };
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
            _ = cut.wait_for(|cut| *cut) => {}
        }
    }
    // Stalled: both ends held open, nothing read or written.
    let _ = cut.wait_for(|cut| !*cut).await;
}
