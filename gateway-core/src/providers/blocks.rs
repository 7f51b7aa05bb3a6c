//! Content blocks as the client sees them, whatever the upstream streamed: each upstream block
//! (keyed by the adapter) gets the next index of ours, a text block opens only with its first
//! non-empty text (so no reply starts with an empty text block, a classic translation bug), and
//! blocks we cannot show are left out without leaving a hole in the numbering. A reply left
//! with no block at all is given one empty text block by the turn (`turn::metered`).

use std::collections::HashMap;

use super::ProviderEvent;
use crate::conversation::{Delta, OutputBlock};

enum Slot {
    Open(usize),
    /// A text block with nothing in it yet.
    PendingText,
}

#[derive(Default)]
pub struct Blocks {
    next: usize,
    slots: HashMap<usize, Slot>,
}

impl Blocks {
    pub fn start(&mut self, key: usize, block: OutputBlock, out: &mut Vec<ProviderEvent>) {
        match block {
            OutputBlock::Text { text } => {
                self.slots.insert(key, Slot::PendingText);
                self.delta(key, Delta::Text { text }, out);
            }
            block => {
                let index = self.open(key);
                out.push(ProviderEvent::BlockStart { index, block });
            }
        }
    }

    pub fn delta(&mut self, key: usize, delta: Delta, out: &mut Vec<ProviderEvent>) {
        let empty = match &delta {
            Delta::Text { text } => text.is_empty(),
            Delta::InputJson { partial_json } => partial_json.is_empty(),
            Delta::Thinking { thinking } => thinking.is_empty(),
            Delta::Signature { signature } => signature.is_empty(),
        };
        if empty {
            return;
        }
        let index = match self.slots.get(&key) {
            Some(Slot::Open(index)) => *index,
            Some(Slot::PendingText) => {
                let index = self.open(key);
                out.push(ProviderEvent::BlockStart {
                    index,
                    block: OutputBlock::Text {
                        text: String::new(),
                    },
                });
                index
            }
            None => return,
        };
        out.push(ProviderEvent::BlockDelta { index, delta });
    }

    pub fn stop(&mut self, key: usize, out: &mut Vec<ProviderEvent>) {
        if let Some(Slot::Open(index)) = self.slots.remove(&key) {
            out.push(ProviderEvent::BlockStop { index });
        }
    }

    /// Closes every block still open, in index order.
    pub fn stop_all(&mut self, out: &mut Vec<ProviderEvent>) {
        let mut open: Vec<usize> = self
            .slots
            .drain()
            .filter_map(|(_, slot)| match slot {
                Slot::Open(index) => Some(index),
                Slot::PendingText => None,
            })
            .collect();
        open.sort_unstable();
        out.extend(
            open.into_iter()
                .map(|index| ProviderEvent::BlockStop { index }),
        );
    }

    fn open(&mut self, key: usize) -> usize {
        let index = self.next;
        self.next += 1;
        self.slots.insert(key, Slot::Open(index));
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_empty_text_block_before_a_tool_call_is_left_out_and_indexes_stay_dense() {
        let mut blocks = Blocks::default();
        let mut out = Vec::new();
        blocks.start(
            0,
            OutputBlock::Text {
                text: String::new(),
            },
            &mut out,
        );
        blocks.delta(
            0,
            Delta::Text {
                text: String::new(),
            },
            &mut out,
        );
        blocks.stop(0, &mut out);
        let tool = OutputBlock::ToolUse {
            id: "toolu_1".into(),
            name: "f".into(),
            input: json!({}),
        };
        blocks.start(1, tool.clone(), &mut out);
        blocks.stop(1, &mut out);
        assert_eq!(
            out,
            vec![
                ProviderEvent::BlockStart {
                    index: 0,
                    block: tool
                },
                ProviderEvent::BlockStop { index: 0 },
            ]
        );
    }

    #[test]
    fn a_text_block_opens_with_its_first_text() {
        let mut blocks = Blocks::default();
        let mut out = Vec::new();
        blocks.start(7, OutputBlock::Text { text: "Hi".into() }, &mut out);
        blocks.stop(7, &mut out);
        assert_eq!(out.len(), 3);
        assert!(matches!(out[1], ProviderEvent::BlockDelta { index: 0, .. }));
    }
}
