//! Token counting with a real BPE vocabulary (o200k_base, the vocabulary of current large
//! models; the exact upstream tokenizer is not public for every provider, so counts are a close
//! estimate that the provider's reported usage corrects at settle). Images are counted from
//! their pixel size the way vision models bill them: about one token per 750 pixels after the
//! image is scaled to fit 1568 px on its long edge and 1.15 megapixels.

use base64::Engine;
use thiserror::Error;
use tiktoken_rs::CoreBPE;

use crate::conversation::{Content, ImageSource, InputBlock, Request};

/// Framing tokens for each message (role and separators), and for priming the reply.
const MESSAGE_OVERHEAD: u32 = 3;
/// What an image given by URL is counted as: the most any image can cost, since the gateway
/// does not fetch it.
const URL_IMAGE_TOKENS: u32 = 1_600;
const MAX_LONG_EDGE: f64 = 1_568.0;
const MAX_PIXELS: f64 = 1_150_000.0;
const PIXELS_PER_TOKEN: f64 = 750.0;
const MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];
/// Enough decoded bytes to find the dimensions in the header of almost every image.
const HEADER_PROBE_BYTES: usize = 64 * 1024;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("{path}: image data is not valid base64")]
    Base64 { path: String },
    #[error("{path}: image data is not a readable png, jpeg, gif or webp image")]
    Image { path: String },
    #[error("{path}: media_type must be one of image/png, image/jpeg, image/gif, image/webp")]
    MediaType { path: String },
    #[error(transparent)]
    Job(#[from] crate::cpu::JobFailed),
}

#[derive(Clone, Copy)]
pub struct Tokenizer {
    bpe: &'static CoreBPE,
}

impl Default for Tokenizer {
    fn default() -> Self {
        Self {
            bpe: tiktoken_rs::o200k_base_singleton(),
        }
    }
}

impl Tokenizer {
    pub fn count(&self, text: &str) -> u32 {
        u32::try_from(self.bpe.encode_ordinary(text).len()).unwrap_or(u32::MAX)
    }

    /// The text cut into its tokens, in order.
    pub fn split(&self, text: &str) -> Vec<String> {
        self.bpe
            .split_by_token_ordinary(text)
            .unwrap_or_else(|_| vec![text.to_owned()])
    }

    /// [`Tokenizer::count_request`], on a blocking thread of [`crate::cpu`] when the request is
    /// large or carries base64 images (decoded to measure them), in place otherwise; the
    /// request is handed back.
    pub async fn count_request_off_workers(
        &self,
        req: Request,
    ) -> Result<(Request, u32), TokenError> {
        if !heavy(&req) {
            let tokens = self.count_request(&req)?;
            return Ok((req, tokens));
        }
        let tokenizer = *self;
        let (req, tokens) = crate::cpu::run(move || {
            let tokens = tokenizer.count_request(&req);
            (req, tokens)
        })
        .await?;
        Ok((req, tokens?))
    }

    /// Input tokens of a request: system prompt, tools and every message.
    pub fn count_request(&self, req: &Request) -> Result<u32, TokenError> {
        let mut total = MESSAGE_OVERHEAD;
        if let Some(system) = req.system_text() {
            total = total.saturating_add(self.count(&system) + MESSAGE_OVERHEAD);
        }
        for tool in &req.tools {
            let schema = serde_json::to_string(&tool.input_schema).unwrap_or_default();
            total = total
                .saturating_add(self.count(&tool.name))
                .saturating_add(self.count(tool.description.as_deref().unwrap_or("")))
                .saturating_add(self.count(&schema))
                .saturating_add(MESSAGE_OVERHEAD);
        }
        for (i, message) in req.messages.iter().enumerate() {
            let path = format!("messages[{i}].content");
            total = total
                .saturating_add(MESSAGE_OVERHEAD)
                .saturating_add(self.count_content(&message.content, &path)?);
        }
        Ok(total)
    }

    fn count_content(&self, content: &Content<InputBlock>, path: &str) -> Result<u32, TokenError> {
        match content {
            Content::Text(text) => Ok(self.count(text)),
            Content::Blocks(blocks) => blocks.iter().enumerate().try_fold(0u32, |sum, (i, b)| {
                Ok(sum.saturating_add(self.count_block(b, &format!("{path}[{i}]"))?))
            }),
        }
    }

    fn count_block(&self, block: &InputBlock, path: &str) -> Result<u32, TokenError> {
        Ok(match block {
            InputBlock::Text { text, .. } => self.count(text),
            InputBlock::Image { source, .. } => image_tokens(source, path)?,
            InputBlock::ToolUse { name, input, .. } => {
                self.count(name) + self.count(&input.to_string())
            }
            InputBlock::ToolResult { content, .. } => match content {
                Some(c) => self.count_content(c, &format!("{path}.content"))?,
                None => 0,
            },
            InputBlock::Thinking { thinking, .. } => self.count(thinking),
            InputBlock::RedactedThinking { data } => self.count(data),
        })
    }
}

/// Whether tokenizing `req` may take long: its text passes [`crate::cpu::INLINE_BYTES`], or it
/// carries base64 images. A walk over the blocks, never over the text itself.
fn heavy(req: &Request) -> bool {
    fn content(c: &Content<InputBlock>, bytes: &mut usize) -> bool {
        match c {
            Content::Text(text) => *bytes += text.len(),
            Content::Blocks(blocks) => {
                for block in blocks {
                    match block {
                        InputBlock::Text { text, .. } => *bytes += text.len(),
                        InputBlock::Image {
                            source: ImageSource::Base64 { .. },
                            ..
                        } => return true,
                        InputBlock::ToolResult {
                            content: Some(inner),
                            ..
                        } => {
                            if content(inner, bytes) {
                                return true;
                            }
                        }
                        InputBlock::Thinking { thinking, .. } => *bytes += thinking.len(),
                        InputBlock::RedactedThinking { data } => *bytes += data.len(),
                        // Tool inputs and URL images: small, or counted as a constant.
                        _ => *bytes += 64,
                    }
                }
            }
        }
        false
    }
    let mut bytes = req.tools.len() * 1024;
    for message in &req.messages {
        if content(&message.content, &mut bytes) || bytes > crate::cpu::INLINE_BYTES {
            return true;
        }
    }
    let system = match &req.system {
        None => 0,
        Some(Content::Text(text)) => text.len(),
        Some(Content::Blocks(blocks)) => blocks.iter().map(|b| b.text.len()).sum(),
    };
    bytes + system > crate::cpu::INLINE_BYTES
}

fn image_tokens(source: &ImageSource, path: &str) -> Result<u32, TokenError> {
    let (media_type, data) = match source {
        ImageSource::Url { .. } => return Ok(URL_IMAGE_TOKENS),
        ImageSource::Base64 { media_type, data } => (media_type, data),
    };
    if !MEDIA_TYPES.contains(&media_type.as_str()) {
        return Err(TokenError::MediaType {
            path: format!("{path}.source.media_type"),
        });
    }
    let (width, height) = image_dimensions(data).map_err(|e| match e {
        DimensionError::Base64 => TokenError::Base64 {
            path: format!("{path}.source.data"),
        },
        DimensionError::Image => TokenError::Image {
            path: format!("{path}.source.data"),
        },
    })?;
    Ok(tokens_for_pixels(width, height))
}

enum DimensionError {
    Base64,
    Image,
}

/// Reads the pixel size from the image header, decoding only a prefix of the base64 text
/// when that suffices.
fn image_dimensions(data: &str) -> Result<(usize, usize), DimensionError> {
    let engine = base64::engine::general_purpose::STANDARD;
    let probe_chars = HEADER_PROBE_BYTES / 3 * 4;
    if data.len() > probe_chars {
        if let Ok(prefix) = engine.decode(&data.as_bytes()[..probe_chars]) {
            if let Ok(size) = imagesize::blob_size(&prefix) {
                return Ok((size.width, size.height));
            }
        }
    }
    let bytes = engine.decode(data).map_err(|_| DimensionError::Base64)?;
    let size = imagesize::blob_size(&bytes).map_err(|_| DimensionError::Image)?;
    Ok((size.width, size.height))
}

fn tokens_for_pixels(width: usize, height: usize) -> u32 {
    let (mut w, mut h) = (width as f64, height as f64);
    let long_edge = w.max(h);
    if long_edge > MAX_LONG_EDGE {
        let scale = MAX_LONG_EDGE / long_edge;
        w *= scale;
        h *= scale;
    }
    if w * h > MAX_PIXELS {
        let scale = (MAX_PIXELS / (w * h)).sqrt();
        w *= scale;
        h *= scale;
    }
    ((w.floor() * h.floor()) / PIXELS_PER_TOKEN).ceil().max(1.0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_counted_with_the_bpe_vocabulary() {
        let t = Tokenizer::default();
        assert_eq!(t.count("hello world"), 2);
        assert_eq!(t.split("hello world").concat(), "hello world");
    }

    #[test]
    fn small_images_cost_their_pixels_over_750() {
        assert_eq!(tokens_for_pixels(200, 200), 54);
    }

    #[test]
    fn large_images_are_scaled_to_the_long_edge_and_pixel_caps() {
        let big = tokens_for_pixels(4000, 3000);
        assert!(big <= (MAX_PIXELS / PIXELS_PER_TOKEN).ceil() as u32);
        assert!(big > 1_400);
    }
}
