//! Leader election with a coordination.k8s.io Lease, so that of several operator replicas
//! exactly one runs the singleton loops (the promotion sweep, scaling).
//!
//! The holder renews the Lease every third of its duration; another replica takes it over
//! once `renewTime + leaseDurationSeconds` has passed. Every write carries the resourceVersion
//! it read, so two replicas racing for an expired Lease cannot both win: the loser gets a
//! conflict and stays a follower.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::Api;
use tokio::sync::watch;

use crate::error::Result;

pub struct Elector {
    pub api: Api<Lease>,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
}

impl Elector {
    /// Runs the election forever, publishing whether this process leads.
    pub async fn run(self, leading: watch::Sender<bool>) {
        loop {
            let now = leading_round(&self, Timestamp::now()).await;
            let is_leader = match now {
                Ok(held) => held,
                Err(error) => {
                    tracing::warn!(%error, lease = %self.name, "lease round failed");
                    // Without a renewal we cannot know the Lease is still ours.
                    false
                }
            };
            leading.send_if_modified(|was| {
                if *was != is_leader {
                    tracing::info!(identity = %self.identity, lease = %self.name, leading = is_leader, "leadership changed");
                    *was = is_leader;
                    true
                } else {
                    false
                }
            });
            tokio::time::sleep(self.duration / 3).await;
        }
    }
}

/// One round: create, renew or take over the Lease; `true` when this process holds it after.
pub async fn leading_round(elector: &Elector, now: Timestamp) -> Result<bool> {
    let Some(mut lease) = elector.api.get_opt(&elector.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(elector.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(held_spec(elector, now, None)),
        };
        return won(elector.api.create(&PostParams::default(), &lease).await);
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let ours = spec.holder_identity.as_deref() == Some(elector.identity.as_str());
    if !ours && !expired(&spec, now) {
        return Ok(false);
    }
    lease.spec = Some(held_spec(elector, now, Some(&spec)));
    won(elector
        .api
        .replace(&elector.name, &PostParams::default(), &lease)
        .await)
}

/// A write that lost a race (conflict or already created) means someone else leads.
fn won(result: kube::Result<Lease>) -> Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error.into()),
    }
}

fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return true;
    };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    renewed.0 + SignedDuration::from_secs(secs) < now
}

/// The spec of a Lease this process holds from `now`, continuing `previous` if it was ours.
fn held_spec(elector: &Elector, now: Timestamp, previous: Option<&LeaseSpec>) -> LeaseSpec {
    let ours =
        previous.is_some_and(|p| p.holder_identity.as_deref() == Some(elector.identity.as_str()));
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(elector.identity.clone()),
        lease_duration_seconds: Some(
            i32::try_from(elector.duration.as_secs().max(1)).unwrap_or(i32::MAX),
        ),
        acquire_time: match previous {
            Some(p) if ours => p.acquire_time.clone(),
            _ => Some(MicroTime(now)),
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours || previous.is_none() {
            transitions
        } else {
            transitions + 1
        }),
        ..LeaseSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use kube::Client;
    use serde_json::{json, Value};
    use tower_test::mock;

    use super::*;
    use crate::testing::{api_server, expect, fail, no_check, Expect, NS};

    const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/gw/leases/gateway-operator";

    fn now() -> Timestamp {
        Timestamp::from_second(1_000_000).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn lease(holder: &str, renewed_secs_ago: i64) -> Value {
        let renewed = now() - SignedDuration::from_secs(renewed_secs_ago);
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "gateway-operator", "namespace": NS, "resourceVersion": "42"},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 15,
                "acquireTime": renewed.to_string(),
                "renewTime": renewed.to_string(),
                "leaseTransitions": 3,
            },
        })
    }

    /// Runs one round of `operator-b` against the API server's answers, given in order.
    async fn round(expected: Vec<Expect>) -> Result<bool> {
        let (service, handle) = mock::pair();
        let server = tokio::spawn(api_server(handle, expected));
        let elector = Elector {
            api: Api::namespaced(Client::new(service, NS), NS),
            name: "gateway-operator".to_owned(),
            identity: "operator-b".to_owned(),
            duration: Duration::from_secs(15),
        };
        let result = leading_round(&elector, now()).await;
        drop(elector);
        if let Err(panic) = server.await {
            std::panic::resume_unwind(panic.into_panic());
        }
        result
    }

    #[tokio::test]
    async fn the_first_replica_creates_the_lease_and_leads() {
        let led = round(vec![
            fail(Method::GET, PATH, 404, "NotFound"),
            expect(
                Method::POST,
                "/apis/coordination.k8s.io/v1/namespaces/gw/leases",
                lease("operator-b", 0),
                |body| assert_eq!(body["spec"]["holderIdentity"], "operator-b"),
            ),
        ])
        .await;
        assert!(matches!(led, Ok(true)));
    }

    #[tokio::test]
    async fn a_lease_another_replica_renewed_in_time_is_left_alone() {
        let led = round(vec![expect(
            Method::GET,
            PATH,
            lease("operator-a", 5),
            no_check,
        )])
        .await;
        assert!(matches!(led, Ok(false)));
    }

    #[tokio::test]
    async fn an_expired_lease_is_taken_over_at_the_version_read() {
        let led = round(vec![
            expect(Method::GET, PATH, lease("operator-a", 20), no_check),
            expect(Method::PUT, PATH, lease("operator-b", 0), |body| {
                assert_eq!(body["metadata"]["resourceVersion"], "42");
                assert_eq!(body["spec"]["holderIdentity"], "operator-b");
                assert_eq!(body["spec"]["leaseTransitions"], 4);
            }),
        ])
        .await;
        assert!(matches!(led, Ok(true)));
    }

    #[tokio::test]
    async fn the_holder_renews_without_counting_a_transition() {
        let led = round(vec![
            expect(Method::GET, PATH, lease("operator-b", 5), no_check),
            expect(Method::PUT, PATH, lease("operator-b", 0), |body| {
                assert_eq!(body["spec"]["leaseTransitions"], 3);
            }),
        ])
        .await;
        assert!(matches!(led, Ok(true)));
    }

    #[tokio::test]
    async fn losing_the_race_for_an_expired_lease_means_following() {
        let led = round(vec![
            expect(Method::GET, PATH, lease("operator-a", 20), no_check),
            fail(Method::PUT, PATH, 409, "Conflict"),
        ])
        .await;
        assert!(matches!(led, Ok(false)));
    }
}
