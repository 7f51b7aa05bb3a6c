//! Every request body is read here, under its surface's size cap ([`BodyCap`]), its read
//! deadline ([`BodyDeadline`]) and the process' memory budget ([`super::budget`]): a declared
//! length over the cap is refused before anything is read, a body that grows past it is cut,
//! one that trickles past its deadline gets 408 (and its connection is closed, the rest of the
//! body unread); a whole body then holds the budget its parsed form needs. No surface reads a
//! body any other way.

use std::net::IpAddr;
use std::time::Duration;

use axum::body::{Body, BodyDataStream, Bytes, HttpBody};
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_LENGTH;
use futures::StreamExt;
use thiserror::Error;
use tokio::time::Instant;

use super::budget::{BudgetError, BudgetOwner, Held, Reservation};
use crate::client_address::ClientAddress;

/// The largest body a surface accepts; set per surface as a request extension. Where none is
/// set, the smallest ([`BodyCap::FORM`]) applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyCap(pub usize);

impl BodyCap {
    /// `/v1`: conversations with images.
    pub const API: Self = Self(16 * 1024 * 1024);
    /// A Message Batch's create: Anthropic's limit. Parsed as it arrives ([`StreamedBody`]),
    /// it holds of the memory budget its largest request, not its length.
    pub const BATCH: Self = Self(256 * 1024 * 1024);
    /// The dashboard's forms: an email, a password, a key name, a token.
    pub const FORM: Self = Self(8 * 1024);
    /// Payment webhooks: one event.
    pub const WEBHOOK: Self = Self(64 * 1024);
    /// The admin API: one account, key or top-up.
    pub const ADMIN: Self = Self(64 * 1024);

    fn of(req: &Request) -> Self {
        req.extensions()
            .get::<Self>()
            .copied()
            .unwrap_or(Self::FORM)
    }
}

/// How much of an oversized body is read and dropped before the 413, and for how long: a
/// client still uploading when the server closes gets a connection reset instead of the 413,
/// so the gateway keeps reading (within these bounds) until the client can read its answer.
const DRAIN_BYTES: usize = 4 * BodyCap::API.0;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// How long a request body may take to arrive: `base`, plus a second for every
/// `min_bytes_per_sec` bytes received, so a client that keeps up the minimum rate always gets
/// its body in and one trickling a byte at a time is cut after `base`; and at most `idle`
/// between two pieces, so a client that sends half its body fast and stalls does not hold its
/// share of the memory budget for the time its first half earned. Set by the server as a
/// request extension; the default applies where none is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyDeadline {
    pub base: Duration,
    pub min_bytes_per_sec: u64,
    pub idle: Duration,
}

impl Default for BodyDeadline {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(30),
            min_bytes_per_sec: 32 * 1024,
            idle: Duration::from_secs(10),
        }
    }
}

impl BodyDeadline {
    fn of(req: &Request) -> Self {
        req.extensions().get::<Self>().copied().unwrap_or_default()
    }

    /// The time by which the body must be in, having received `received` bytes so far.
    fn until(&self, started: Instant, received: usize) -> Instant {
        let earned = Duration::from_secs_f64(received as f64 / self.min_bytes_per_sec as f64);
        started + self.base + earned
    }
}

/// Why a body was not read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("request body exceeds the {limit_bytes} byte limit")]
    TooLarge { limit_bytes: usize },
    #[error("the request body was not received in time; send it faster or in one piece")]
    Timeout,
    #[error("could not read the request body")]
    Unreadable,
    #[error(transparent)]
    Budget(#[from] BudgetError),
}

/// A body not read yet, with what bounds its reading: for handlers that check what they can
/// (a webhook's signature header) before the body is buffered.
pub struct UnreadBody {
    body: Body,
    bounds: Bounds,
}

impl<S: Send + Sync> FromRequest<S> for UnreadBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self {
            bounds: Bounds::of(&req),
            body: req.into_body(),
        })
    }
}

impl UnreadBody {
    /// Refuses a declared length over the cap, before anything else is checked.
    pub fn check_declared(&self) -> Result<(), BodyError> {
        self.bounds.check_declared()
    }

    /// The whole body, under its bounds (a declared length over the cap refused first).
    pub async fn read(self) -> Result<Vec<u8>, BodyError> {
        self.bounds.read(self.body, Shape::Parsed).await
    }
}

/// The request's whole body, under its surface's cap, its declared length, its deadline and
/// the memory budget (whose share the request then holds until it is answered).
pub async fn read_request(req: Request) -> Result<Vec<u8>, BodyError> {
    let bounds = Bounds::of(&req);
    bounds.read(req.into_body(), Shape::Parsed).await
}

/// [`read_request`] for a body that is kept as bytes, never parsed whole (a file upload,
/// checked a line at a time): it holds the budget of its bytes, not of their parsed form.
pub async fn read_upload(req: Request) -> Result<Vec<u8>, BodyError> {
    let bounds = Bounds::of(&req);
    bounds.read(req.into_body(), Shape::Bytes).await
}

/// A body read a piece at a time under its surface's cap and read deadline, as every body is,
/// holding of the memory budget only what its handler keeps of it ([`StreamedBody::hold`]),
/// not its declared length: for a body parsed as it arrives (a Message Batch create, a request
/// at a time). The share is handed back when it is dropped.
pub struct StreamedBody {
    stream: BodyDataStream,
    cap: BodyCap,
    deadline: BodyDeadline,
    started: Instant,
    received: usize,
    reservation: Reservation,
    ended: bool,
}

/// The request's body as a [`StreamedBody`]; a declared length over the cap is refused first.
pub async fn read_streamed(req: Request) -> Result<StreamedBody, BodyError> {
    let bounds = Bounds::of(&req);
    let mut stream = req.into_body().into_data_stream();
    if let Err(e) = bounds.check_declared() {
        drain_some(&mut stream).await;
        return Err(e);
    }
    let started = Instant::now();
    let reservation = Reservation::of_client(bounds.owner.clone(), bounds.address)
        .reading(started + bounds.deadline.base.min(bounds.deadline.idle));
    Ok(StreamedBody {
        stream,
        cap: bounds.cap,
        deadline: bounds.deadline,
        started,
        received: 0,
        reservation,
        ended: false,
    })
}

impl StreamedBody {
    /// The next piece of the body, `None` at its end: 408 past its read deadline, 413 past the
    /// cap (the rest read and dropped, within bounds, so that the client gets the answer).
    pub async fn next(&mut self) -> Result<Option<Bytes>, BodyError> {
        if self.ended {
            return Ok(None);
        }
        let idle_until = Instant::now() + self.deadline.idle;
        let until = self
            .deadline
            .until(self.started, self.received)
            .min(idle_until);
        self.reservation.read_until(until);
        let Ok(next) = tokio::time::timeout_at(until, self.stream.next()).await else {
            return Err(BodyError::Timeout);
        };
        let Some(chunk) = next else {
            self.ended = true;
            self.reservation.read();
            return Ok(None);
        };
        let chunk = chunk.map_err(|_| BodyError::Unreadable)?;
        self.received += chunk.len();
        if self.received > self.cap.0 {
            drain_some(&mut self.stream).await;
            return Err(BodyError::TooLarge {
                limit_bytes: self.cap.0,
            });
        }
        Ok(Some(chunk))
    }

    /// Holds `cost` bytes of the memory budget (when that is more than is held): what the
    /// handler keeps of the body at this point. Never gives any back before the drop.
    pub async fn hold(&mut self, cost: usize) -> Result<(), BodyError> {
        Ok(self.reservation.grow_to_cost(self.received, cost).await?)
    }

    /// The bytes received so far.
    pub fn received(&self) -> usize {
        self.received
    }
}

/// What a body becomes once read, and so the share of the memory budget it holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Parsed,
    Bytes,
}

struct Bounds {
    cap: BodyCap,
    declared: Option<usize>,
    deadline: BodyDeadline,
    held: Option<Held>,
    owner: Option<BudgetOwner>,
    /// The client's address, which a body with no owner is counted by.
    address: Option<IpAddr>,
}

impl Bounds {
    fn of(req: &Request) -> Self {
        Self {
            cap: BodyCap::of(req),
            declared: req
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<usize>().ok())
                // A body built in process, or whose framing fixes its length, says it itself.
                .or_else(|| {
                    let exact = req.body().size_hint().exact()?;
                    usize::try_from(exact).ok()
                }),
            deadline: BodyDeadline::of(req),
            held: req.extensions().get::<Held>().cloned(),
            owner: req.extensions().get::<BudgetOwner>().cloned(),
            address: req
                .extensions()
                .get::<ClientAddress>()
                .and_then(|address| address.0),
        }
    }

    fn check_declared(&self) -> Result<(), BodyError> {
        match self.declared {
            Some(n) if n > self.cap.0 => Err(BodyError::TooLarge {
                limit_bytes: self.cap.0,
            }),
            _ => Ok(()),
        }
    }

    async fn read(self, body: Body, shape: Shape) -> Result<Vec<u8>, BodyError> {
        let held = self.held.clone();
        let (bytes, reservation) = self.read_reserved(body, shape).await?;
        if let Some(held) = held {
            held.keep(reservation);
        }
        Ok(bytes)
    }

    async fn read_reserved(
        self,
        body: Body,
        shape: Shape,
    ) -> Result<(Vec<u8>, Reservation), BodyError> {
        let started = Instant::now();
        let mut stream = body.into_data_stream();
        let refuse = |stream, e: BodyError| async move {
            drain(stream).await;
            Err(e)
        };
        if let Err(e) = self.check_declared() {
            return refuse(stream, e).await;
        }
        let cut_at = |received| {
            let idle_until = Instant::now() + self.deadline.idle;
            self.deadline.until(started, received).min(idle_until)
        };
        let mut reservation =
            Reservation::of_client(self.owner.clone(), self.address).reading(cut_at(0));
        if let Some(n) = self.declared {
            if let Err(e) = reservation.grow_to(n).await {
                return refuse(stream, e.into()).await;
            }
        }
        let mut bytes = Vec::with_capacity(self.declared.unwrap_or(0));
        loop {
            let until = cut_at(bytes.len());
            reservation.read_until(until);
            let Ok(next) = tokio::time::timeout_at(until, stream.next()).await else {
                return Err(BodyError::Timeout);
            };
            let Some(chunk) = next else { break };
            let chunk = chunk.map_err(|_| BodyError::Unreadable)?;
            let size = bytes.len() + chunk.len();
            if size > self.cap.0 {
                let limit_bytes = self.cap.0;
                return refuse(stream, BodyError::TooLarge { limit_bytes }).await;
            }
            if let Err(e) = reservation.grow_to(size).await {
                return refuse(stream, e.into()).await;
            }
            bytes.extend_from_slice(&chunk);
        }
        reservation.read();
        // Only now is the body's shape known: many small values parse to far more memory
        // than their bytes.
        if shape == Shape::Parsed {
            reservation.grow_to_parsed(&bytes).await?;
        }
        Ok((bytes, reservation))
    }
}

pub async fn drain(mut stream: BodyDataStream) {
    drain_some(&mut stream).await;
}

async fn drain_some(stream: &mut BodyDataStream) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut read = 0;
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
}
