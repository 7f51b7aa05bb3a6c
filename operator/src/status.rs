//! What each resource's `Ready` condition says after a compilation: the only verdicts a
//! resource can get, worked out without the API so they are tested as plain functions.

use crds::compile::ResourceRef;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::isolation::{Fate, Isolated};

pub const READY: &str = "Ready";

/// The `Ready` condition a resource should carry, without its timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Verdict {
    /// The verdict for `resource` after a compilation that published (`Ok`) or did not.
    pub fn of(resource: &ResourceRef, outcome: &Isolated, secret: &str) -> Self {
        if let Some(fault) = outcome.faults.get(resource) {
            let consequence = match (&outcome.compiled, fault.fate) {
                (Err(_), _) => "gateways keep the last good configuration",
                (Ok(_), Fate::KeptLastGood) => {
                    "its last published version stays in the gateway configuration"
                }
                (Ok(_), Fate::LeftOut) => "left out of the gateway configuration",
            };
            return Self {
                ready: false,
                reason: "Invalid",
                message: format!("{}; {consequence}", fault.problems.join("; ")),
            };
        }
        let Err(errors) = &outcome.compiled else {
            return Self {
                ready: true,
                reason: "Published",
                message: format!("part of the gateway configuration in Secret {secret}"),
            };
        };
        let general: Vec<&str> = errors
            .errors
            .iter()
            .filter(|e| e.resource.is_none())
            .map(|e| e.message.as_str())
            .collect();
        Self {
            ready: false,
            reason: "Blocked",
            message: format!(
                "valid, but nothing is published while the namespace has problems that no \
                 single resource owns; gateways keep the last good configuration: {}",
                general.join("; ")
            ),
        }
    }

    /// Whether `current` already says this, so an unchanged status is not written again.
    pub fn matches(&self, current: Option<&Condition>, generation: Option<i64>) -> bool {
        current.is_some_and(|c| {
            c.status == self.status()
                && c.reason == self.reason
                && c.message == self.message
                && c.observed_generation == generation
        })
    }

    /// The condition to write; the transition time moves only when the status flips.
    pub fn condition(
        &self,
        current: Option<&Condition>,
        generation: Option<i64>,
        now: Timestamp,
    ) -> Condition {
        let since = match current {
            Some(c) if c.status == self.status() => c.last_transition_time.clone(),
            _ => Time(now),
        };
        Condition {
            type_: READY.to_owned(),
            status: self.status().to_owned(),
            reason: self.reason.to_owned(),
            message: self.message.clone(),
            observed_generation: generation,
            last_transition_time: since,
        }
    }

    fn status(&self) -> &'static str {
        if self.ready {
            "True"
        } else {
            "False"
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crds::compile::{CompileError, CompileErrors};
    use crds::config::GatewayConfig;

    use super::*;
    use crate::isolation::{Fault, LastGood};

    fn route(name: &str) -> ResourceRef {
        ResourceRef {
            kind: "ModelRoute",
            namespace: Some("gw".to_owned()),
            name: name.to_owned(),
        }
    }

    /// A compilation that published (`general` empty) or not, with `broken` at fault.
    fn outcome(general: &[&str], fate: Fate) -> Isolated {
        let compiled = if general.is_empty() {
            Ok(GatewayConfig::default())
        } else {
            Err(CompileErrors {
                errors: general
                    .iter()
                    .map(|m| CompileError {
                        resource: None,
                        message: (*m).to_owned(),
                    })
                    .collect(),
            })
        };
        Isolated {
            compiled,
            faults: BTreeMap::from([(
                route("broken"),
                Fault {
                    problems: vec!["Secret missing not found".to_owned()],
                    fate,
                },
            )]),
            kept: LastGood::default(),
        }
    }

    #[test]
    fn a_published_resource_is_ready() {
        let verdict = Verdict::of(&route("ok"), &outcome(&[], Fate::LeftOut), "gateway-config");
        assert!(verdict.ready);
        assert_eq!(verdict.reason, "Published");
    }

    #[test]
    fn an_invalid_resource_names_its_own_problems_and_what_the_gateways_run_instead() {
        let cases = [
            (
                outcome(&[], Fate::LeftOut),
                "Secret missing not found; left out of the gateway configuration",
            ),
            (
                outcome(&[], Fate::KeptLastGood),
                "Secret missing not found; its last published version stays in the gateway \
                 configuration",
            ),
            (
                outcome(&["no Tier declares tier free"], Fate::LeftOut),
                "Secret missing not found; gateways keep the last good configuration",
            ),
        ];
        for (outcome, message) in cases {
            let verdict = Verdict::of(&route("broken"), &outcome, "gateway-config");
            assert!(!verdict.ready);
            assert_eq!(verdict.reason, "Invalid");
            assert_eq!(verdict.message, message);
        }
    }

    #[test]
    fn a_valid_resource_is_blocked_only_by_problems_no_resource_owns() {
        let blocked = outcome(&["no Tier declares tier free"], Fate::LeftOut);
        let verdict = Verdict::of(&route("ok"), &blocked, "gateway-config");
        assert!(!verdict.ready);
        assert_eq!(verdict.reason, "Blocked");
        assert!(verdict.message.ends_with(": no Tier declares tier free"));
        assert!(!verdict.message.contains("Secret missing"));
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_flips() {
        let earlier = Timestamp::from_second(1_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let now = Timestamp::from_second(2_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let published = Verdict::of(&route("ok"), &outcome(&[], Fate::LeftOut), "gateway-config");
        let current = published.condition(None, Some(1), earlier);
        assert_eq!(current.last_transition_time, Time(earlier));
        let same_status = published.condition(Some(&current), Some(2), now);
        assert_eq!(same_status.last_transition_time, Time(earlier));
        let blocked = Verdict::of(
            &route("ok"),
            &outcome(&["no Tier declares tier free"], Fate::LeftOut),
            "gateway-config",
        );
        assert_eq!(
            blocked
                .condition(Some(&current), Some(2), now)
                .last_transition_time,
            Time(now)
        );
    }

    #[test]
    fn an_unchanged_verdict_for_the_same_generation_needs_no_write() {
        let verdict = Verdict::of(&route("ok"), &outcome(&[], Fate::LeftOut), "gateway-config");
        let current = verdict.condition(None, Some(3), Timestamp::UNIX_EPOCH);
        assert!(verdict.matches(Some(&current), Some(3)));
        assert!(!verdict.matches(Some(&current), Some(4)));
        assert!(!verdict.matches(None, Some(3)));
    }
}
