//! Token counting with a real BPE vocabulary (o200k_base, the vocabulary of current large
//! models; the exact upstream tokenizer is not public for every provider, so counts are a close
//! estimate that the provider's reported usage corrects at settle). Images are counted from
//! their pixel size the way vision models bill them: about one token per 750 pixels after the
//! image is scaled to fit 1568 px on its long edge and 1.15 megapixels.
//!
//! Counting costs time linear in the text whatever its shape. BPE merges within one
//! pre-tokenized piece in time growing with the square of its length, and a word has no length
//! limit: one 15 MiB word took 19 s and 745 MiB. So the text goes to the BPE in inputs cut
//! only where the vocabulary's pre-tokenizer starts a new piece anyway (before a space that
//! opens a word), which counts exactly as the whole text would, except that a run of more than
//! [`MAX_RUN_BYTES`] without such a place (a giant word, base64, minified JSON) is cut every
//! [`MAX_RUN_BYTES`] bytes. Such a cut may split a token in two: about one token more per
//! 128 bytes of such runs at most (+0.2 % on random letters; prose and code with spaces count
//! exactly). The provider's reported usage corrects the estimate at settle. Long
//! counts run on a blocking thread and stop between inputs once their client has gone.

use base64::Engine;
use thiserror::Error;
use tiktoken_rs::CoreBPE;

use crate::conversation::{Content, ImageSource, InputBlock, Request};
use crate::cpu::{self, Abandoned};

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
/// The longest run of text handed to the BPE without a piece boundary in it: merging costs
/// at most this many steps per byte.
const MAX_RUN_BYTES: usize = 128;
/// The most text handed to the BPE at once: the counting checks for an abandoned request
/// between inputs (and allocates the tokens of one input at a time).
const CHUNK_BYTES: usize = 64 * 1024;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("{path}: image data is not valid base64")]
    Base64 { path: String },
    #[error("{path}: image data is not a readable png, jpeg, gif or webp image")]
    Image { path: String },
    #[error("{path}: media_type must be one of image/png, image/jpeg, image/gif, image/webp")]
    MediaType { path: String },
    #[error(transparent)]
    Job(#[from] cpu::JobFailed),
    #[error("the request was abandoned by its client while it was counted")]
    Abandoned,
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
        self.count_until(text, Abandoned::never())
            .unwrap_or(u32::MAX)
    }

    /// The tokens of `text`, counted input by input ([`bpe_inputs`]) until `abandoned` is set.
    fn count_until(&self, text: &str, abandoned: &Abandoned) -> Result<u32, TokenError> {
        let mut total = 0u32;
        for input in bpe_inputs(text) {
            if abandoned.is_set() {
                // Once a job: the error ends the whole count.
                cpu::job_abandoned();
                return Err(TokenError::Abandoned);
            }
            let tokens = self.bpe.encode_ordinary(input).len();
            total = total.saturating_add(u32::try_from(tokens).unwrap_or(u32::MAX));
        }
        Ok(total)
    }

    /// The text cut into its tokens, in order.
    pub fn split(&self, text: &str) -> Vec<String> {
        self.bpe
            .split_by_token_ordinary(text)
            .unwrap_or_else(|_| vec![text.to_owned()])
    }

    /// [`Tokenizer::count_request`], on a blocking thread of [`crate::cpu`] when the request is
    /// large or carries base64 images (decoded to measure them), in place otherwise; the
    /// request is handed back. Dropping the future (its client hung up) stops the counting.
    pub async fn count_request_off_workers(
        &self,
        req: Request,
    ) -> Result<(Request, u32), TokenError> {
        if !heavy(&req) {
            let tokens = self.count_request(&req, Abandoned::never())?;
            return Ok((req, tokens));
        }
        let tokenizer = *self;
        let (req, tokens) = cpu::run_abandonable(move |abandoned| {
            let tokens = tokenizer.count_request(&req, abandoned);
            (req, tokens)
        })
        .await?;
        Ok((req, tokens?))
    }

    /// Input tokens of a request: system prompt, tools and every message.
    fn count_request(&self, req: &Request, abandoned: &Abandoned) -> Result<u32, TokenError> {
        let count = |text: &str| self.count_until(text, abandoned);
        let mut total = MESSAGE_OVERHEAD;
        if let Some(system) = req.system_text() {
            total = total.saturating_add(count(&system)?.saturating_add(MESSAGE_OVERHEAD));
        }
        for tool in &req.tools {
            let schema = serde_json::to_string(&tool.input_schema).unwrap_or_default();
            total = total
                .saturating_add(count(&tool.name)?)
                .saturating_add(count(tool.description.as_deref().unwrap_or(""))?)
                .saturating_add(count(&schema)?)
                .saturating_add(MESSAGE_OVERHEAD);
        }
        for (i, message) in req.messages.iter().enumerate() {
            let path = format!("messages[{i}].content");
            total = total
                .saturating_add(MESSAGE_OVERHEAD)
                .saturating_add(self.count_content(&message.content, &path, abandoned)?);
        }
        Ok(total)
    }

    fn count_content(
        &self,
        content: &Content<InputBlock>,
        path: &str,
        abandoned: &Abandoned,
    ) -> Result<u32, TokenError> {
        match content {
            Content::Text(text) => self.count_until(text, abandoned),
            Content::Blocks(blocks) => blocks.iter().enumerate().try_fold(0u32, |sum, (i, b)| {
                let path = format!("{path}[{i}]");
                Ok(sum.saturating_add(self.count_block(b, &path, abandoned)?))
            }),
        }
    }

    fn count_block(
        &self,
        block: &InputBlock,
        path: &str,
        abandoned: &Abandoned,
    ) -> Result<u32, TokenError> {
        let count = |text: &str| self.count_until(text, abandoned);
        Ok(match block {
            InputBlock::Text { text, .. } => count(text)?,
            InputBlock::Image { source, .. } => image_tokens(source, path)?,
            InputBlock::ToolUse { name, input, .. } => {
                count(name)?.saturating_add(count(&input.to_string())?)
            }
            InputBlock::ToolResult { content, .. } => match content {
                Some(c) => self.count_content(c, &format!("{path}.content"), abandoned)?,
                None => 0,
            },
            InputBlock::Thinking { thinking, .. } => count(thinking)?,
            InputBlock::RedactedThinking { data } => count(data)?,
        })
    }
}

/// `text` in the pieces it is handed to the BPE in: each at most about [`CHUNK_BYTES`], cut
/// where a new pre-tokenized piece starts anyway ([`opens_piece`]), or inside a run longer
/// than [`MAX_RUN_BYTES`] without such a place. Together they are `text`; finding them is
/// linear (each byte is scanned at most twice).
fn bpe_inputs(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (input, tail) = rest.split_at(next_cut(rest));
        rest = tail;
        Some(input)
    })
}

/// Where the first BPE input of `text` (not empty) ends.
fn next_cut(text: &str) -> usize {
    let mut last_opening = 0;
    for (i, c) in text.char_indices() {
        if i - last_opening >= MAX_RUN_BYTES {
            // A run too long: the text before it goes as it is, the run in cuts.
            return if last_opening > 0 { last_opening } else { i };
        }
        if i >= CHUNK_BYTES {
            // Here `last_opening` is within MAX_RUN_BYTES of i, so past 0.
            return last_opening;
        }
        if i > 0 && opens_piece(text, i, c) {
            last_opening = i;
        }
    }
    text.len()
}

/// Whether the character `c` at byte `i` of `text` starts a pre-tokenized piece whatever came
/// before: a space followed by a character that is not whitespace. In o200k_base (as in
/// cl100k_base) a space before a word, number or punctuation is that piece's first character,
/// and a whitespace run leaves its last space to what follows it.
fn opens_piece(text: &str, i: usize, c: char) -> bool {
    c == ' '
        && text[i + 1..]
            .chars()
            .next()
            .is_some_and(|next| !next.is_whitespace())
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
        if content(&message.content, &mut bytes) || bytes > cpu::INLINE_BYTES {
            return true;
        }
    }
    let system = match &req.system {
        None => 0,
        Some(Content::Text(text)) => text.len(),
        Some(Content::Blocks(blocks)) => blocks.iter().map(|b| b.text.len()).sum(),
    };
    bytes + system > cpu::INLINE_BYTES
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

    /// The BPE's merging work on an input, bounded above by the square of its longest run
    /// without a piece opening.
    fn merge_work_bound(input: &str) -> usize {
        let mut longest = 0;
        let mut start = 0;
        for (i, c) in input.char_indices() {
            if i > 0 && opens_piece(input, i, c) {
                longest = longest.max(i - start);
                start = i;
            }
        }
        longest = longest.max(input.len() - start);
        longest * longest
    }

    fn shapes() -> Vec<(&'static str, String)> {
        let prose = "The quick brown fox, 1234 jumps over the lazy dog.\n\tIt's  ok?  ";
        vec![
            ("one long word", "a".repeat(1 << 20)),
            (
                "one long word of many letters",
                "abcdefghij".repeat(100_000),
            ),
            ("digits", "7".repeat(1 << 20)),
            ("base64-like", "Zm9vYmFy+/09".repeat(80_000)),
            ("multibyte letters", "é".repeat(400_000)),
            ("prose", prose.repeat(20_000)),
            ("spaces only", " ".repeat(1 << 20)),
        ]
    }

    #[test]
    fn counting_work_is_linear_in_the_text_whatever_its_shape() {
        for (shape, text) in shapes() {
            let inputs: Vec<&str> = bpe_inputs(&text).collect();
            assert_eq!(inputs.concat(), text, "{shape}: the inputs are the text");
            let work: usize = inputs.iter().map(|input| merge_work_bound(input)).sum();
            // At most MAX_RUN_BYTES (plus a character) merge steps per byte.
            let bound = (MAX_RUN_BYTES + 4) * text.len();
            assert!(work <= bound, "{shape}: work {work} over {bound}");
            assert!(
                inputs.iter().all(|input| input.len() <= CHUNK_BYTES + 4),
                "{shape}: an input over {CHUNK_BYTES} bytes"
            );
        }
    }

    #[test]
    fn text_with_spaces_counts_exactly_as_the_whole_text_would() {
        let t = Tokenizer::default();
        let text = "The quick brown fox, 1234 jumps over   the lazy dog.\n\t  It's ok?\r\n \
                    Ça coûte 12,50 €; naïve café — 東京 and ünïcödé!  "
            .repeat(5_000);
        assert!(text.len() > 2 * CHUNK_BYTES);
        let exact = t.bpe.encode_ordinary(&text).len();
        assert_eq!(t.count(&text) as usize, exact);
    }

    #[test]
    fn a_long_run_without_spaces_is_counted_within_a_few_percent() {
        let t = Tokenizer::default();
        // Letters in no pattern, so that tokens are short and cuts fall inside them.
        let mut seed = 7u32;
        let text: String = (0..8_192)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                char::from(b'a' + (seed >> 16) as u8 % 26)
            })
            .collect();
        let exact = t.bpe.encode_ordinary(&text).len() as f64;
        let counted = f64::from(t.count(&text));
        eprintln!("8 KiB of random letters: {counted} tokens counted, {exact} exact");
        assert!(
            (counted - exact).abs() / exact < 0.03,
            "counted {counted}, exact {exact}"
        );
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
