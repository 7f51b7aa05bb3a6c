//! Conversation affinity: the turns of one conversation go to the same upstream, because a
//! provider's prompt cache lives in one account or deployment and agent clients resend a long,
//! growing prompt on every turn. A turn that moves pays the cache write again and misses the
//! reads.
//!
//! The conversation is recognised without client changes, first match wins:
//! 1. a key the client sends: Claude Code's `X-Claude-Code-Session-Id` header, the
//!    `prompt_cache_key` of the Responses API and of chat completions (the edge passes either
//!    as the turn's explicit key), then the request's `metadata.user_id` (chat completions'
//!    `user`);
//! 2. else the prompt's stable prefix: the system prompt, the tool names and the first user
//!    message's text, which every later turn of the conversation repeats unchanged
//!    (`cache_control` markers, which clients move from turn to turn, are left out).
//!
//! The upstreams are then ordered by weighted rendezvous hashing of that key: a pure function
//! of the key and the route's upstreams (names and weights), so every pod picks the same
//! upstream without sharing state, the weights hold across many conversations, and adding or
//! removing an upstream moves only the conversations it takes or gave up. When the first is
//! failing or its breaker is open, the turn goes to the next in the same order, so the
//! conversation stays on that fallback until the first is healthy again.

use crds::config::Upstream;
use sha2::{Digest, Sha256};

use crate::conversation::{Content, InputBlock, Request, Role};

/// At most this much of each prefix part is hashed: enough to tell conversations apart,
/// and the cost of a huge prompt stays bounded on the async workers.
const PREFIX_BYTES: usize = 64 * 1024;

/// A conversation's routing key (which upstream its turns go to): a digest, never the
/// client's text. Not the conversation itself (`crate::conversation`), only its identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffinityKey([u8; 32]);

impl AffinityKey {
    /// The conversation a turn belongs to; `explicit` is a key the client sent outside the
    /// request body (header or `prompt_cache_key`).
    pub fn of(explicit: Option<&str>, request: &Request) -> Self {
        let user = request.metadata.as_ref().and_then(|m| m.user_id.as_deref());
        match explicit.or(user).filter(|k| !k.is_empty()) {
            Some(key) => Self::keyed(key),
            None => Self::prefix(request),
        }
    }

    /// A key named outright (an embeddings call's end user or API key).
    pub fn named(key: &str) -> Self {
        Self::keyed(key)
    }

    fn keyed(key: &str) -> Self {
        let mut hash = Sha256::new();
        part(&mut hash, b"key", key);
        Self(hash.finalize().into())
    }

    fn prefix(request: &Request) -> Self {
        let mut hash = Sha256::new();
        part(
            &mut hash,
            b"system",
            &request.system_text().unwrap_or_default(),
        );
        for tool in &request.tools {
            part(&mut hash, b"tool", &tool.name);
        }
        if let Some(first) = request.messages.iter().find(|m| m.role == Role::User) {
            match &first.content {
                Content::Text(text) => part(&mut hash, b"user", text),
                Content::Blocks(blocks) => {
                    for block in blocks {
                        if let InputBlock::Text { text, .. } = block {
                            part(&mut hash, b"user", text);
                        }
                    }
                }
            }
        }
        Self(hash.finalize().into())
    }

    /// The upstreams in this conversation's order: the first is its home, the others its
    /// fallbacks in turn. Weighted rendezvous: each upstream scores `-ln(u) / weight`, with
    /// `u` uniform in (0, 1) from the hash of the conversation and the upstream's name; the
    /// lowest score comes first, which makes an upstream first with probability
    /// proportional to its weight.
    pub fn order(&self, upstreams: &[Upstream]) -> Vec<Upstream> {
        let mut scored: Vec<(f64, &Upstream)> =
            upstreams.iter().map(|u| (self.score(u), u)).collect();
        scored.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        scored.into_iter().map(|(_, u)| u.clone()).collect()
    }

    fn score(&self, upstream: &Upstream) -> f64 {
        let digest = Sha256::new()
            .chain_update(self.0)
            .chain_update(upstream.name.as_bytes())
            .finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        // 53 bits fill an f64's mantissa exactly; the half keeps u off 0 and 1.
        let u = ((u64::from_be_bytes(first) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        -u.ln() / f64::from(upstream.weight.max(1))
    }
}

/// Hashes one labelled, length-prefixed part, so that parts cannot run into each other.
fn part(hash: &mut Sha256, label: &[u8], text: &str) {
    let bytes = &text.as_bytes()[..text.len().min(PREFIX_BYTES)];
    hash.update(label);
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::config::{ProviderKind, Timeouts};

    fn upstream(name: &str, weight: u32) -> Upstream {
        Upstream {
            name: name.to_owned(),
            provider: ProviderKind::Simulated,
            model: "m".to_owned(),
            base_url: None,
            api_version: None,
            region: None,
            aws_credentials: None,
            project: None,
            google_credentials: None,
            api_key: None,
            weight,
            timeouts: Timeouts::default(),
            http2: false,
            chunk_delay_ms: 0,
        }
    }

    use crate::conversation::tests::say;
    use crate::conversation::{Message, Metadata, Tool};

    /// A request of `messages` that uses one tool, `read`, with no system prompt or user id
    /// unless a test sets them.
    fn request(messages: Vec<Message>) -> Request {
        Request {
            model: "svc/haiku".into(),
            max_tokens: 10,
            messages,
            tools: vec![Tool {
                name: "read".into(),
                description: None,
                input_schema: serde_json::json!({}),
                cache_control: None,
            }],
            ..Request::default()
        }
    }

    fn user_block(text: &str, cache_control: Option<serde_json::Value>) -> Message {
        Message {
            role: Role::User,
            content: Content::Blocks(vec![InputBlock::Text {
                text: text.into(),
                cache_control,
                citations: None,
            }]),
        }
    }

    fn first(conversation: &AffinityKey, upstreams: &[Upstream]) -> String {
        conversation.order(upstreams)[0].name.clone()
    }

    #[test]
    fn every_turn_of_a_conversation_has_the_same_order_and_later_turns_keep_its_prefix() {
        let upstreams = [upstream("a", 3), upstream("b", 1), upstream("c", 1)];
        let ephemeral = Some(serde_json::json!({"type": "ephemeral"}));
        let mut turn1 = request(vec![user_block("fix the bug", ephemeral)]);
        let mut turn2 = request(vec![
            user_block("fix the bug", None),
            say(Role::Assistant, "done"),
            say(Role::User, "thanks"),
        ]);
        for turn in [&mut turn1, &mut turn2] {
            turn.system = Some(Content::Text("you are terse".into()));
        }
        let (c1, c2) = (AffinityKey::of(None, &turn1), AffinityKey::of(None, &turn2));
        assert_eq!(c1, c2);
        assert_eq!(c1.order(&upstreams), c2.order(&upstreams));
    }

    #[test]
    fn an_explicit_key_wins_over_metadata_and_the_prefix() {
        let mut with_user = request(vec![say(Role::User, "hello")]);
        let mut other_prompt = request(vec![say(Role::User, "something else")]);
        for turn in [&mut with_user, &mut other_prompt] {
            turn.metadata = Some(Metadata {
                user_id: Some("u-1".into()),
            });
        }
        assert_eq!(
            AffinityKey::of(None, &with_user),
            AffinityKey::of(None, &other_prompt)
        );
        assert_eq!(
            AffinityKey::of(Some("session-9"), &with_user),
            AffinityKey::of(Some("session-9"), &other_prompt)
        );
        assert_ne!(
            AffinityKey::of(Some("session-9"), &with_user),
            AffinityKey::of(None, &with_user)
        );
    }

    #[test]
    fn across_many_conversations_the_first_upstream_follows_the_weights() {
        let upstreams = [upstream("heavy", 3), upstream("light", 1)];
        let n = 20_000;
        let heavy = (0..n)
            .filter(|i| first(&AffinityKey::keyed(&format!("c{i}")), &upstreams) == "heavy")
            .count();
        let share = heavy as f64 / f64::from(n);
        assert!((share - 0.75).abs() < 0.015, "heavy share {share}");
    }

    #[test]
    fn adding_an_upstream_moves_only_conversations_to_it() {
        let before = [upstream("a", 1), upstream("b", 1)];
        let after = [upstream("a", 1), upstream("b", 1), upstream("c", 1)];
        for i in 0..2_000 {
            let c = AffinityKey::keyed(&format!("c{i}"));
            let now = first(&c, &after);
            assert!(now == "c" || now == first(&c, &before), "conversation {i}");
        }
    }
}
