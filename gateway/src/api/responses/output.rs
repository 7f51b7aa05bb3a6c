//! A turn's events as a Responses API response: each block of the turn's output becomes an output
//! item (text a `message` with one `output_text` part, `tool_use` a `function_call`, thinking a
//! `reasoning` item), and each event the stream events that grow it. The JSON answer is the same
//! fold with the events thrown away, so both forms always agree.

use std::collections::HashMap;

use serde_json::Value;

use crate::error::ApiError;
use gateway_core::conversation::{BilledUsage, Delta, OutputBlock};
use gateway_core::providers::ProviderEvent;
use gateway_core::seal::{Sealer, Thinking};
use gateway_core::tokens::Tokenizer;
use gateway_core::turn::TurnEvent;
use gateway_core::wire::responses::translate::{usage_to_responses, ToolNames};
use gateway_core::wire::responses::{
    IncompleteDetails, OutputContent, OutputItem, ResponseError, ResponseObject, ResponseUsage,
    Status, StreamEvent, SummaryText,
};
use store::usage::StopReason;

/// How the output is shown to this client.
pub struct Shape {
    /// `reasoning.summary` was asked for: thinking is shown as the reasoning item's summary.
    pub summary: bool,
    /// `include: ["reasoning.encrypted_content"]`: reasoning items carry the sealed thinking.
    pub encrypted_content: bool,
    pub names: ToolNames,
    pub sealer: Sealer,
    pub tokens: Tokenizer,
}

/// What one turn event produced.
#[derive(Default)]
pub struct Step {
    pub events: Vec<StreamEvent>,
    /// The turn failed: the stream's `error` event, the JSON answer's error.
    pub failed: Option<ApiError>,
    /// The turn is over (completed, incomplete or failed).
    pub done: bool,
}

/// An output item still receiving deltas, by the upstream's block index.
enum Open {
    Text {
        output_index: usize,
        text: String,
    },
    Call {
        output_index: usize,
        arguments: String,
    },
    Thinking {
        output_index: usize,
        thinking: String,
        signature: String,
        summary_started: bool,
    },
}

pub struct Assembler {
    pub response: ResponseObject,
    shape: Shape,
    open: HashMap<usize, Open>,
    /// Sealed thinking by reasoning item id, kept in the stored copy even when the client did
    /// not ask for it, so that `previous_response_id` continues the thinking.
    sealed: HashMap<String, String>,
    reasoning_text: String,
}

impl Assembler {
    pub fn new(response: ResponseObject, shape: Shape) -> Self {
        Self {
            response,
            shape,
            open: HashMap::new(),
            sealed: HashMap::new(),
            reasoning_text: String::new(),
        }
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&self) -> Vec<StreamEvent> {
        vec![
            StreamEvent::Created {
                response: self.response.clone(),
            },
            StreamEvent::InProgress {
                response: self.response.clone(),
            },
        ]
    }

    pub fn step(&mut self, event: TurnEvent) -> Step {
        let mut step = Step::default();
        match event {
            TurnEvent::Provider(ProviderEvent::BlockStart { index, block }) => {
                self.block_start(index, block, &mut step.events);
            }
            TurnEvent::Provider(ProviderEvent::BlockDelta { index, delta }) => {
                self.block_delta(index, delta, &mut step.events);
            }
            TurnEvent::Provider(ProviderEvent::BlockStop { index }) => {
                self.block_stop(index, &mut step.events);
            }
            TurnEvent::Provider(ProviderEvent::Started { .. } | ProviderEvent::Finish { .. }) => {}
            TurnEvent::Finished {
                stop_reason, usage, ..
            } => {
                // Blocks the upstream left open are closed, in order, before the response ends.
                let mut open: Vec<usize> = self.open.keys().copied().collect();
                open.sort_unstable();
                for index in open {
                    self.block_stop(index, &mut step.events);
                }
                self.response.usage = Some(self.usage(&usage));
                // The Responses API has one reason for a cut answer (`max_output_tokens` or
                // `content_filter`): a full context window cuts it as max_output_tokens does.
                let cut = matches!(
                    stop_reason,
                    StopReason::MaxTokens | StopReason::ModelContextWindowExceeded
                );
                let response = if cut {
                    self.response.status = Status::Incomplete;
                    self.response.incomplete_details = Some(IncompleteDetails {
                        reason: "max_output_tokens",
                    });
                    StreamEvent::Incomplete {
                        response: self.response.clone(),
                    }
                } else {
                    self.response.status = Status::Completed;
                    StreamEvent::Completed {
                        response: self.response.clone(),
                    }
                };
                step.events.push(response);
                step.done = true;
            }
            TurnEvent::Interrupted { usage } => {
                // A stream cut short: its failed response tells what the part sent was billed.
                self.response.usage = Some(self.usage(&usage));
                return self.fail(ApiError::interrupted_stream());
            }
            TurnEvent::Failed(error) => return self.fail(ApiError::from(error)),
        }
        step
    }

    /// Ends the response as failed: `response.failed`, then (written by the caller) the
    /// stream's `error` event unless the failure told a bill.
    pub fn fail(&mut self, error: ApiError) -> Step {
        self.response.status = Status::Failed;
        self.response.error = Some(ResponseError {
            code: "server_error",
            message: error.message.clone(),
        });
        Step {
            events: vec![StreamEvent::Failed {
                response: self.response.clone(),
            }],
            failed: Some(error),
            done: true,
        }
    }

    /// The response as stored: reasoning items always carry their sealed thinking.
    pub fn stored(&self) -> Value {
        let mut response = self.response.clone();
        for item in &mut response.output {
            if let OutputItem::Reasoning {
                id,
                encrypted_content,
                ..
            } = item
            {
                if let Some(sealed) = self.sealed.get(id.as_str()) {
                    *encrypted_content = Some(sealed.clone());
                }
            }
        }
        serde_json::to_value(&response).unwrap_or_default()
    }

    fn usage(&self, usage: &BilledUsage) -> ResponseUsage {
        // Upstreams count thinking within the output without a separate figure: the gateway's
        // count of the thinking text stands for it.
        let reasoning = self
            .shape
            .tokens
            .count(&self.reasoning_text)
            .min(usage.tokens.output_tokens);
        usage_to_responses(usage, reasoning)
    }

    fn push_item(&mut self, item: OutputItem, events: &mut Vec<StreamEvent>) -> usize {
        let output_index = self.response.output.len();
        events.push(StreamEvent::OutputItemAdded {
            output_index,
            item: item.clone(),
        });
        self.response.output.push(item);
        output_index
    }

    fn item_id(&self, output_index: usize) -> String {
        self.response
            .output
            .get(output_index)
            .map(|item| item.id().to_owned())
            .unwrap_or_default()
    }

    fn block_start(&mut self, index: usize, block: OutputBlock, events: &mut Vec<StreamEvent>) {
        let open = match block {
            OutputBlock::Text { .. } => {
                let item = OutputItem::Message {
                    id: gateway_core::ids::response_item("message"),
                    status: Status::InProgress,
                    role: "assistant",
                    content: Vec::new(),
                };
                let output_index = self.push_item(item, events);
                let part = output_text(String::new());
                if let Some(OutputItem::Message { content, .. }) =
                    self.response.output.get_mut(output_index)
                {
                    content.push(part.clone());
                }
                events.push(StreamEvent::ContentPartAdded {
                    item_id: self.item_id(output_index),
                    output_index,
                    content_index: 0,
                    part,
                });
                Open::Text {
                    output_index,
                    text: String::new(),
                }
            }
            OutputBlock::ToolUse { id, name, .. } => {
                let (namespace, name) = self.shape.names.client(&name);
                let item = OutputItem::FunctionCall {
                    id: gateway_core::ids::response_item("function_call"),
                    call_id: gateway_core::ids::openai_call(&id),
                    name,
                    namespace,
                    arguments: String::new(),
                    status: Status::InProgress,
                };
                Open::Call {
                    output_index: self.push_item(item, events),
                    arguments: String::new(),
                }
            }
            OutputBlock::Thinking { .. } => {
                let item = OutputItem::Reasoning {
                    id: gateway_core::ids::response_item("reasoning"),
                    summary: Vec::new(),
                    encrypted_content: None,
                    status: Status::InProgress,
                };
                Open::Thinking {
                    output_index: self.push_item(item, events),
                    thinking: String::new(),
                    signature: String::new(),
                    summary_started: false,
                }
            }
        };
        self.open.insert(index, open);
    }

    fn block_delta(&mut self, index: usize, delta: Delta, events: &mut Vec<StreamEvent>) {
        let Some(open) = self.open.get_mut(&index) else {
            return;
        };
        match (open, delta) {
            (Open::Text { output_index, text }, Delta::Text { text: more }) => {
                text.push_str(&more);
                let output_index = *output_index;
                events.push(StreamEvent::OutputTextDelta {
                    item_id: self.item_id(output_index),
                    output_index,
                    content_index: 0,
                    delta: more,
                    logprobs: Vec::new(),
                });
            }
            (
                Open::Call {
                    output_index,
                    arguments,
                },
                Delta::InputJson { partial_json },
            ) => {
                arguments.push_str(&partial_json);
                let output_index = *output_index;
                events.push(StreamEvent::FunctionCallArgumentsDelta {
                    item_id: self.item_id(output_index),
                    output_index,
                    delta: partial_json,
                });
            }
            (
                Open::Thinking {
                    output_index,
                    thinking,
                    summary_started,
                    ..
                },
                Delta::Thinking { thinking: more },
            ) => {
                thinking.push_str(&more);
                self.reasoning_text.push_str(&more);
                if !self.shape.summary {
                    return;
                }
                let output_index = *output_index;
                let first = !std::mem::replace(summary_started, true);
                let item_id = self.item_id(output_index);
                if first {
                    events.push(StreamEvent::ReasoningSummaryPartAdded {
                        item_id: item_id.clone(),
                        output_index,
                        summary_index: 0,
                        part: SummaryText::new(String::new()),
                    });
                }
                events.push(StreamEvent::ReasoningSummaryTextDelta {
                    item_id,
                    output_index,
                    summary_index: 0,
                    delta: more,
                });
            }
            (Open::Thinking { signature, .. }, Delta::Signature { signature: more }) => {
                signature.push_str(&more);
            }
            _ => {}
        }
    }

    fn block_stop(&mut self, index: usize, events: &mut Vec<StreamEvent>) {
        let Some(open) = self.open.remove(&index) else {
            return;
        };
        let (output_index, finished) = match open {
            Open::Text { output_index, text } => {
                let item_id = self.item_id(output_index);
                events.push(StreamEvent::OutputTextDone {
                    item_id: item_id.clone(),
                    output_index,
                    content_index: 0,
                    text: text.clone(),
                    logprobs: Vec::new(),
                });
                let part = output_text(text);
                events.push(StreamEvent::ContentPartDone {
                    item_id: item_id.clone(),
                    output_index,
                    content_index: 0,
                    part: part.clone(),
                });
                let item = OutputItem::Message {
                    id: item_id,
                    status: Status::Completed,
                    role: "assistant",
                    content: vec![part],
                };
                (output_index, item)
            }
            Open::Call {
                output_index,
                arguments,
            } => {
                let Some(OutputItem::FunctionCall {
                    id,
                    call_id,
                    name,
                    namespace,
                    ..
                }) = self.response.output.get(output_index).cloned()
                else {
                    return;
                };
                // A call without arguments is a call with an empty object.
                let arguments = if arguments.trim().is_empty() {
                    "{}".to_owned()
                } else {
                    arguments
                };
                events.push(StreamEvent::FunctionCallArgumentsDone {
                    item_id: id.clone(),
                    output_index,
                    name: name.clone(),
                    arguments: arguments.clone(),
                });
                let item = OutputItem::FunctionCall {
                    id,
                    call_id,
                    name,
                    namespace,
                    arguments,
                    status: Status::Completed,
                };
                (output_index, item)
            }
            Open::Thinking {
                output_index,
                thinking,
                signature,
                summary_started,
            } => {
                let item_id = self.item_id(output_index);
                if summary_started {
                    events.push(StreamEvent::ReasoningSummaryTextDone {
                        item_id: item_id.clone(),
                        output_index,
                        summary_index: 0,
                        text: thinking.clone(),
                    });
                    events.push(StreamEvent::ReasoningSummaryPartDone {
                        item_id: item_id.clone(),
                        output_index,
                        summary_index: 0,
                        part: SummaryText::new(thinking.clone()),
                    });
                }
                let sealed = self.shape.sealer.seal(&Thinking {
                    thinking: thinking.clone(),
                    signature,
                });
                self.sealed.insert(item_id.clone(), sealed.clone());
                let item = OutputItem::Reasoning {
                    id: item_id,
                    summary: if summary_started {
                        vec![SummaryText::new(thinking)]
                    } else {
                        Vec::new()
                    },
                    encrypted_content: self.shape.encrypted_content.then_some(sealed),
                    status: Status::Completed,
                };
                (output_index, item)
            }
        };
        if let Some(slot) = self.response.output.get_mut(output_index) {
            *slot = finished.clone();
        }
        events.push(StreamEvent::OutputItemDone {
            output_index,
            item: finished,
        });
    }
}

fn output_text(text: String) -> OutputContent {
    OutputContent::OutputText {
        text,
        annotations: Vec::new(),
        logprobs: Vec::new(),
    }
}
