//! The usage a streamed LLM answer reports at its end, read from its server-sent events
//! (feature `sse`).
//!
//! A streamed answer does not know its token count when its head arrives: the providers send it
//! in the stream itself —
//!
//! * OpenAI's Chat Completions, with `stream_options: {"include_usage": true}`: a last chunk
//!   whose `usage` holds `prompt_tokens`, `completion_tokens` and `total_tokens` (the chunks
//!   before it carry `"usage": null`); the Responses API: a `response.completed` event whose
//!   `response.usage` holds `input_tokens`, `output_tokens` and `total_tokens`;
//! * Anthropic's Messages: `message_start`, whose `message.usage` holds the input
//!   (`input_tokens`, `cache_creation_input_tokens`, `cache_read_input_tokens`), then
//!   `message_delta` events whose `usage.output_tokens` is the output so far (the last one is
//!   the total).
//!
//! [`SseUsage`] is fed the stream's bytes as they come (in chunks of any size: a line split
//! across two chunks is joined) and keeps the latest usage seen; [`usage_of_event`] reads one
//! event's `data`. Nothing here panics on bad input: what is not an event with a usage is
//! skipped, a line longer than [`SseUsage::MAX_LINE`] is dropped (memory stays bounded).
//!
//! ```
//! use wavegate_core::SseUsage;
//!
//! let mut usage = SseUsage::new();
//! usage.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\nda");
//! usage.feed(b"ta: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":30,\"total_tokens\":42}}\n\n");
//! usage.feed(b"data: [DONE]\n\n");
//! let seen = usage.usage().unwrap();
//! assert_eq!((seen.input, seen.output, seen.tokens()), (12, 30, 42));
//! ```

use serde_json::Value;

/// The tokens a streamed answer used, as its provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamUsage {
    /// Input (prompt) tokens the provider counts against its limits: OpenAI's `prompt_tokens`
    /// or `input_tokens` (cached ones included, as OpenAI counts them); Anthropic's
    /// `input_tokens` plus `cache_creation_input_tokens`.
    pub input: u64,
    /// Anthropic's `cache_read_input_tokens` (not in [`input`](Self::input): Anthropic does
    /// not count them against its input tokens per minute).
    pub cache_read: u64,
    /// Of [`input`](Self::input), the cached reads the provider counted inside it (OpenAI's
    /// `prompt_tokens_details.cached_tokens`, the Responses API's
    /// `input_tokens_details.cached_tokens`).
    pub cached: u64,
    /// Output (completion) tokens: `completion_tokens` or `output_tokens`.
    pub output: u64,
}

impl StreamUsage {
    /// The tokens to settle a tokens-per-minute budget with: input plus output (cache reads
    /// left out).
    pub fn tokens(&self) -> u64 {
        self.input.saturating_add(self.output)
    }

    /// The input a provider counts when a cached input read weighs `cache_read_weight` of an
    /// uncached token (0: not counted, as Anthropic's ITPM for most models; 1: counted in
    /// full, as OpenAI's TPM): the input without its cached reads, plus the weight of every
    /// cached read (OpenAI's inside the input, Anthropic's beside it), rounded to the nearest
    /// token. `None`: the input as reported ([`input`](Self::input)). A weight outside
    /// `[0, 1]` is clamped. A usage that says both (a proxy such as LiteLLM describing
    /// Anthropic's usage in OpenAI's format, with `cached_tokens` and `cache_read_input_tokens`
    /// both) says the same reads twice: they are counted once, as the ones inside the input.
    ///
    /// ```
    /// use wavegate_core::StreamUsage;
    ///
    /// // Anthropic: 100 new tokens of prompt, 5,000 read from its cache.
    /// let usage = StreamUsage { input: 100, cache_read: 5_000, ..StreamUsage::default() };
    /// assert_eq!(usage.input_counted(None), 100);
    /// assert_eq!(usage.input_counted(Some(1.0)), 5_100); // a model whose ITPM counts cache reads
    /// // OpenAI: 6,000 of prompt, 5,000 of them cached.
    /// let usage = StreamUsage { input: 6_000, cached: 5_000, ..StreamUsage::default() };
    /// assert_eq!(usage.input_counted(None), 6_000);
    /// assert_eq!(usage.input_counted(Some(0.1)), 1_500);
    /// ```
    pub fn input_counted(&self, cache_read_weight: Option<f64>) -> u64 {
        let Some(weight) = cache_read_weight else { return self.input };
        let weight = if weight.is_nan() { 1.0 } else { weight.clamp(0.0, 1.0) };
        let cached = self.cached.min(self.input);
        let reads = if cached > 0 { cached } else { self.cache_read };
        (self.input - cached).saturating_add((reads as f64 * weight).round() as u64)
    }

    /// The usage an answer's JSON body reports (a whole answer, not streamed: OpenAI's
    /// `usage`, Anthropic's `usage`, the Responses API's `response.usage`), if it has one.
    ///
    /// ```
    /// use wavegate_core::StreamUsage;
    ///
    /// let body = r#"{"usage":{"input_tokens":100,"cache_read_input_tokens":5000,"output_tokens":40}}"#;
    /// let usage = StreamUsage::of_body(body).unwrap();
    /// assert_eq!((usage.input, usage.cache_read, usage.output), (100, 5_000, 40));
    /// ```
    pub fn of_body(body: &str) -> Option<StreamUsage> {
        let update = usage_of_event(body)?;
        let mut usage = StreamUsage::default();
        usage.apply(update);
        Some(usage)
    }

    fn apply(&mut self, update: UsageUpdate) {
        self.input = update.input.unwrap_or(self.input);
        self.cache_read = update.cache_read.unwrap_or(self.cache_read);
        self.cached = update.cached.unwrap_or(self.cached);
        self.output = update.output.unwrap_or(self.output);
    }
}

/// What one event said about the usage: each field it carries replaces the one seen before
/// (Anthropic's `message_delta` carries the output only, so the input of `message_start` stays).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageUpdate {
    /// Input tokens, if the event said.
    pub input: Option<u64>,
    /// Cache reads (Anthropic), if the event said.
    pub cache_read: Option<u64>,
    /// Of the input, the cached reads (OpenAI), if the event said.
    pub cached: Option<u64>,
    /// Output tokens, if the event said.
    pub output: Option<u64>,
}

impl UsageUpdate {
    fn is_empty(&self) -> bool {
        self.input.is_none() && self.cache_read.is_none() && self.cached.is_none() && self.output.is_none()
    }
}

/// Reads the usage in one event's `data` (a JSON object), if it has one: `usage` at the top
/// (OpenAI's last chunk, Anthropic's `message_delta`), `message.usage` (Anthropic's
/// `message_start`) or `response.usage` (OpenAI's Responses API). `[DONE]`, `"usage": null`,
/// other events and data that is not JSON give `None`.
pub fn usage_of_event(data: &str) -> Option<UsageUpdate> {
    // Most events are content deltas: no need to parse those.
    if !data.contains("\"usage\"") {
        return None;
    }
    let event: Value = serde_json::from_str(data).ok()?;
    let usage = [event.get("usage"), event.get("message").and_then(|m| m.get("usage"))]
        .into_iter()
        .chain([event.get("response").and_then(|r| r.get("usage"))])
        .flatten()
        .find(|usage| usage.is_object())?;
    let field = |name: &str| usage.get(name).and_then(Value::as_u64);
    let input = match (field("prompt_tokens"), field("input_tokens"), field("cache_creation_input_tokens")) {
        (Some(prompt), _, _) => Some(prompt),
        (None, Some(input), created) => Some(input.saturating_add(created.unwrap_or(0))),
        (None, None, created) => created,
    };
    let output = field("completion_tokens").or_else(|| field("output_tokens"));
    // Only a total: all of it counts (as input, for want of a split).
    let input = input.or_else(|| if output.is_none() { field("total_tokens") } else { None });
    let cached = ["prompt_tokens_details", "input_tokens_details"]
        .into_iter()
        .find_map(|details| usage.get(details).and_then(|d| d.get("cached_tokens")).and_then(Value::as_u64));
    let update = UsageUpdate { input, cache_read: field("cache_read_input_tokens"), cached, output };
    (!update.is_empty()).then_some(update)
}

/// Reads the usage of a stream of server-sent events as its bytes come; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct SseUsage {
    /// The current line, not yet ended.
    line: Vec<u8>,
    /// The line being read is too long: skipped up to its end.
    skipping: bool,
    /// The current event's `data` lines, joined by `\n`.
    data: String,
    /// The latest usage seen, if any.
    usage: Option<StreamUsage>,
    /// The last byte was a `\r` (a `\n` right after it ends nothing more).
    after_cr: bool,
}

impl SseUsage {
    /// The longest line kept (1 MiB): a longer one is dropped, whatever it held.
    pub const MAX_LINE: usize = 1 << 20;

    /// A reader that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads `chunk`, the next bytes of the stream.
    pub fn feed(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => self.end_line(),
                _ if self.skipping => {}
                _ if self.line.len() >= Self::MAX_LINE => {
                    self.line.clear();
                    self.skipping = true;
                }
                _ => self.line.push(byte),
            }
        }
    }

    /// The stream ended: an event not followed by its blank line is read too.
    pub fn finish(&mut self) {
        if !self.line.is_empty() || self.skipping {
            self.end_line();
        }
        self.dispatch();
    }

    /// The latest usage seen so far, if any.
    pub fn usage(&self) -> Option<StreamUsage> {
        self.usage
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        if std::mem::replace(&mut self.skipping, false) {
            return;
        }
        if line.is_empty() {
            self.dispatch();
            return;
        }
        // `data: x` or `data:x`; other fields (`event:`, `id:`, comments) say nothing of usage.
        let Some(value) = line.strip_prefix(b"data:") else { return };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if self.data.len() + value.len() > Self::MAX_LINE {
            return;
        }
        if !self.data.is_empty() {
            self.data.push('\n');
        }
        self.data.push_str(&String::from_utf8_lossy(value));
    }

    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        let Some(update) = usage_of_event(&data) else { return };
        self.usage.get_or_insert_with(StreamUsage::default).apply(update);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(chunks: &[&[u8]]) -> Option<StreamUsage> {
        let mut usage = SseUsage::new();
        for chunk in chunks {
            usage.feed(chunk);
        }
        usage.finish();
        usage.usage()
    }

    #[test]
    fn openai_chat_completions_final_chunk() {
        let stream = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":19,\"completion_tokens\":10,",
            "\"total_tokens\":29,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
            "data: [DONE]\n\n"
        );
        let expected = StreamUsage { input: 19, cache_read: 0, cached: 0, output: 10 };
        assert_eq!(read(&[stream.as_bytes()]), Some(expected));
        // Cut anywhere, byte by byte, with CRLF line ends: the same.
        let bytes: Vec<&[u8]> = stream.as_bytes().chunks(1).collect();
        assert_eq!(read(&bytes), Some(expected));
        let crlf = stream.replace('\n', "\r\n");
        let (a, b) = crlf.as_bytes().split_at(crlf.len() / 2);
        assert_eq!(read(&[a, b]), Some(expected));
        assert_eq!(expected.tokens(), 29);
    }

    #[test]
    fn anthropic_message_start_then_message_delta() {
        let stream = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":25,",
            "\"cache_creation_input_tokens\":5,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n",
            "event: message_stop\n",
            "data: {\"type\":\"message_stop\"}\n\n"
        );
        let usage = read(&[stream.as_bytes()]).expect("a usage");
        assert_eq!(usage, StreamUsage { input: 30, cache_read: 100, cached: 0, output: 15 });
        assert_eq!(usage.tokens(), 45);
    }

    #[test]
    fn openai_responses_api_completed_event() {
        let event = "{\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":3,\"total_tokens\":10}}}";
        assert_eq!(
            usage_of_event(event),
            Some(UsageUpdate { input: Some(7), cache_read: None, cached: None, output: Some(3) })
        );
    }

    #[test]
    fn no_usage_bad_input_and_long_lines_are_skipped() {
        assert_eq!(usage_of_event("[DONE]"), None);
        assert_eq!(usage_of_event("{\"usage\":null}"), None);
        assert_eq!(usage_of_event("{\"usage\": {broken"), None);
        assert_eq!(usage_of_event("{\"usage\":{\"prompt_tokens\":-3}}"), None);
        assert_eq!(read(&[b"\xff\xfe\n\n: comment\n\nevent: x\n\n"]), None);
        // A line over the bound is dropped; the stream goes on being read after it.
        let mut usage = SseUsage::new();
        usage.feed(b"data: {\"usage\":{\"prompt_tokens\":1,");
        usage.feed(&vec![b' '; SseUsage::MAX_LINE + 10]);
        usage.feed(b"\"completion_tokens\":2}}\n\ndata: {\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":5}}\n\n");
        assert_eq!(usage.usage(), Some(StreamUsage { input: 4, cache_read: 0, cached: 0, output: 5 }));
        // An event without its final blank line still counts at the end.
        assert_eq!(
            read(&[b"data: {\"usage\":{\"total_tokens\":9}}"]),
            Some(StreamUsage { input: 9, ..Default::default() })
        );
    }

    #[test]
    fn openai_cached_tokens_are_read_and_weighed() {
        let usage = read(&[concat!(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":6000,\"completion_tokens\":20,",
            "\"total_tokens\":6020,\"prompt_tokens_details\":{\"cached_tokens\":5000}}}\n\n"
        )
        .as_bytes()])
        .expect("a usage");
        assert_eq!((usage.input, usage.cached, usage.output), (6_000, 5_000, 20));
        assert_eq!(usage.input_counted(Some(0.0)), 1_000);
        assert_eq!(usage.input_counted(Some(f64::NAN)), 6_000);
        assert_eq!(usage.input_counted(Some(7.0)), 6_000);
        // A cached count above the input (a garbled answer) takes at most the input.
        let odd = StreamUsage { input: 10, cached: 50, ..StreamUsage::default() };
        assert_eq!(odd.input_counted(Some(0.0)), 0);
    }

    #[test]
    fn reads_said_twice_by_a_proxy_are_counted_once() {
        // LiteLLM's OpenAI-format usage of an Anthropic call: the prompt with its cache reads,
        // the reads as `cached_tokens`, and again as `cache_read_input_tokens`.
        let usage = read(&[concat!(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5100,\"completion_tokens\":20,",
            "\"prompt_tokens_details\":{\"cached_tokens\":5000},\"cache_read_input_tokens\":5000}}\n\n"
        )
        .as_bytes()])
        .expect("a usage");
        assert_eq!((usage.input, usage.cached, usage.cache_read), (5_100, 5_000, 5_000));
        assert_eq!(usage.input_counted(Some(0.0)), 100);
        assert_eq!(usage.input_counted(Some(1.0)), 5_100, "the reads counted twice");
    }
}
