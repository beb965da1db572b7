//! A server-sent events reader that takes input split anywhere: a line
//! (and an event) may span any number of reads. It keeps only the line
//! being read and the event being assembled, both bounded.
//!
//! Lines end in `\n` (a `\r` before it is dropped): both providers write
//! `\n`. Fields other than `event` and `data` are ignored, as are comments.

/// Why the input is not an SSE stream this reader accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseError {
    /// One event (or line) is larger than the bound.
    TooLarge,
}

#[derive(Debug)]
pub struct SseReader {
    /// The part of a line that arrived without its `\n` yet.
    partial: Vec<u8>,
    event: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    max: usize,
}

/// One event: its `event:` name (empty when none) and its data.
pub struct Event<'a> {
    pub name: &'a [u8],
    pub data: &'a [u8],
}

impl SseReader {
    pub fn new(max_event_bytes: usize) -> Self {
        SseReader {
            partial: Vec::new(),
            event: Vec::new(),
            data: Vec::new(),
            has_data: false,
            max: max_event_bytes,
        }
    }

    /// Feed bytes; `on_event` runs for each event completed by them.
    pub fn feed<E: From<SseError>>(
        &mut self,
        mut input: &[u8],
        on_event: &mut impl FnMut(Event<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        while let Some(nl) = input.iter().position(|&b| b == b'\n') {
            let (line, rest) = input.split_at(nl);
            input = rest.get(1..).unwrap_or_default();
            if self.partial.is_empty() {
                self.line(line, on_event)?;
            } else {
                if self.partial.len() + line.len() > self.max {
                    return Err(SseError::TooLarge.into());
                }
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                let r = self.line(&whole, on_event);
                whole.clear();
                self.partial = whole;
                r?;
            }
        }
        if self.partial.len() + input.len() > self.max {
            return Err(SseError::TooLarge.into());
        }
        self.partial.extend_from_slice(input);
        Ok(())
    }

    fn line<E: From<SseError>>(
        &mut self,
        line: &[u8],
        on_event: &mut impl FnMut(Event<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if self.has_data {
                let r = on_event(Event {
                    name: &self.event,
                    data: &self.data,
                });
                self.event.clear();
                self.data.clear();
                self.has_data = false;
                return r;
            }
            self.event.clear();
            return Ok(());
        }
        if line.first() == Some(&b':') {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(c) => {
                let v = line.get(c + 1..).unwrap_or_default();
                (
                    line.get(..c).unwrap_or_default(),
                    v.strip_prefix(b" ").unwrap_or(v),
                )
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
            }
            b"data" => {
                if self.data.len() + value.len() + 1 > self.max {
                    return Err(SseError::TooLarge.into());
                }
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<(String, String)> {
        let mut r = SseReader::new(1024);
        let mut out = Vec::new();
        for c in chunks {
            r.feed::<SseError>(c, &mut |e| {
                out.push((
                    String::from_utf8_lossy(e.name).into_owned(),
                    String::from_utf8_lossy(e.data).into_owned(),
                ));
                Ok(())
            })
            .unwrap();
        }
        out
    }

    #[test]
    fn events_across_reads() {
        let whole: &[u8] = b": hi\nevent: a\r\ndata: 1\ndata:2\n\ndata: [DONE]\n\n";
        let expect = vec![
            ("a".to_string(), "1\n2".to_string()),
            (String::new(), "[DONE]".to_string()),
        ];
        assert_eq!(events(&[whole]), expect);
        for i in 0..whole.len() {
            let (a, b) = whole.split_at(i);
            assert_eq!(events(&[a, b]), expect, "split at {i}");
        }
    }

    #[test]
    fn an_event_past_the_bound_is_refused() {
        let mut r = SseReader::new(12);
        let mut f = |_: Event<'_>| Ok::<(), SseError>(());
        assert_eq!(
            r.feed(b"data: 0123456789abc\n", &mut f),
            Err(SseError::TooLarge)
        );
        let mut r = SseReader::new(12);
        assert!(r.feed(b"data: 0123", &mut f).is_ok());
        assert_eq!(r.feed(b"456789", &mut f), Err(SseError::TooLarge));
    }
}
