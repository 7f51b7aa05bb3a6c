//! What each resource's `Ready` condition says after a compilation: the only verdicts a
//! resource can get, worked out without the API so they are tested as plain functions.

use crds::compile::{CompileErrors, ResourceRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

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
    pub fn of(resource: &ResourceRef, outcome: Result<(), &CompileErrors>, secret: &str) -> Self {
        let Err(errors) = outcome else {
            return Self {
                ready: true,
                reason: "Published",
                message: format!("part of the gateway configuration in Secret {secret}"),
            };
        };
        let own: Vec<&str> = errors
            .errors
            .iter()
            .filter(|e| e.resource.as_ref() == Some(resource))
            .map(|e| e.message.as_str())
            .collect();
        if !own.is_empty() {
            return Self {
                ready: false,
                reason: "Invalid",
                message: format!(
                    "{}; gateways keep the last good configuration",
                    own.join("; ")
                ),
            };
        }
        let general: Vec<&str> = errors
            .errors
            .iter()
            .filter(|e| e.resource.is_none())
            .map(|e| e.message.as_str())
            .collect();
        let mut message = String::from(
            "valid, but not published while other resources are invalid (see their Ready \
             condition); gateways keep the last good configuration",
        );
        if !general.is_empty() {
            message.push_str(": ");
            message.push_str(&general.join("; "));
        }
        Self {
            ready: false,
            reason: "Blocked",
            message,
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
    use crds::compile::CompileError;

    use super::*;

    fn route(name: &str) -> ResourceRef {
        ResourceRef {
            kind: "ModelRoute",
            namespace: Some("gw".to_owned()),
            name: name.to_owned(),
        }
    }

    fn errors() -> CompileErrors {
        CompileErrors {
            errors: vec![
                CompileError {
                    resource: Some(route("broken")),
                    message: "Secret missing not found".to_owned(),
                },
                CompileError {
                    resource: None,
                    message: "no Tier declares tier free".to_owned(),
                },
            ],
        }
    }

    #[test]
    fn a_published_resource_is_ready() {
        let verdict = Verdict::of(&route("ok"), Ok(()), "gateway-config");
        assert!(verdict.ready);
        assert_eq!(verdict.reason, "Published");
    }

    #[test]
    fn an_invalid_resource_names_its_own_problems_and_the_kept_config() {
        let verdict = Verdict::of(&route("broken"), Err(&errors()), "gateway-config");
        assert!(!verdict.ready);
        assert_eq!(verdict.reason, "Invalid");
        assert_eq!(
            verdict.message,
            "Secret missing not found; gateways keep the last good configuration"
        );
    }

    #[test]
    fn a_valid_resource_in_an_invalid_config_is_blocked_with_the_general_problems() {
        let verdict = Verdict::of(&route("ok"), Err(&errors()), "gateway-config");
        assert!(!verdict.ready);
        assert_eq!(verdict.reason, "Blocked");
        assert!(verdict.message.ends_with(": no Tier declares tier free"));
        assert!(!verdict.message.contains("Secret missing"));
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_flips() {
        let earlier = Timestamp::from_second(1_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let now = Timestamp::from_second(2_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let published = Verdict::of(&route("ok"), Ok(()), "gateway-config");
        let current = published.condition(None, Some(1), earlier);
        assert_eq!(current.last_transition_time, Time(earlier));
        let same_status = published.condition(Some(&current), Some(2), now);
        assert_eq!(same_status.last_transition_time, Time(earlier));
        let blocked = Verdict::of(&route("ok"), Err(&errors()), "gateway-config");
        assert_eq!(
            blocked
                .condition(Some(&current), Some(2), now)
                .last_transition_time,
            Time(now)
        );
    }

    #[test]
    fn an_unchanged_verdict_for_the_same_generation_needs_no_write() {
        let verdict = Verdict::of(&route("ok"), Ok(()), "gateway-config");
        let current = verdict.condition(None, Some(3), Timestamp::UNIX_EPOCH);
        assert!(verdict.matches(Some(&current), Some(3)));
        assert!(!verdict.matches(Some(&current), Some(4)));
        assert!(!verdict.matches(None, Some(3)));
    }
}
