//! Wire primitives shared by Keyway's compact binary encodings (the map
//! codec here, migration records in `keyway-migration`): LEB128 varints,
//! length-prefixed byte strings, optional integers. Reading checks every
//! length against the input, so corrupt bytes give a [`WireError`], never a
//! panic or an allocation the input cannot back.

/// Why bytes did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireError(pub &'static str);

/// Appends encoded values to a byte vector.
#[derive(Debug, Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn with_capacity(bytes: usize) -> Self {
        Writer(Vec::with_capacity(bytes))
    }
    pub fn into_inner(self) -> Vec<u8> {
        self.0
    }
    pub fn u8(&mut self, b: u8) {
        self.0.push(b);
    }
    /// LEB128 varint.
    pub fn var(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    /// `0` for none, `1` then the varint for some.
    pub fn opt(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.var(v);
            }
        }
    }
    /// Varint length, then the bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        self.var(b.len() as u64);
        self.0.extend_from_slice(b);
    }
}

/// Reads encoded values from a byte slice, front to back.
#[derive(Debug)]
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader(bytes)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.0.len()
    }
    pub fn u8(&mut self) -> Result<u8, WireError> {
        let (&b, rest) = self.0.split_first().ok_or(WireError("truncated"))?;
        self.0 = rest;
        Ok(b)
    }
    pub fn var(&mut self) -> Result<u64, WireError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError("varint too long"))
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        u32::try_from(self.var()?).map_err(|_| WireError("u32 out of range"))
    }
    pub fn opt(&mut self) -> Result<Option<u64>, WireError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.var().map(Some),
            _ => Err(WireError("option tag")),
        }
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let len = usize::try_from(self.var()?).map_err(|_| WireError("length"))?;
        if len > self.0.len() {
            return Err(WireError("truncated bytes"));
        }
        let (b, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(b)
    }
    pub fn string(&mut self) -> Result<String, WireError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| WireError("utf-8"))
    }
    /// Errs unless every byte was read.
    pub fn finish(&self) -> Result<(), WireError> {
        self.0
            .is_empty()
            .then_some(())
            .ok_or(WireError("trailing bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let mut w = Writer::default();
        w.var(0);
        w.var(u64::MAX);
        w.opt(None);
        w.opt(Some(300));
        w.bytes(b"abc");
        let bytes = w.into_inner();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.var(), Ok(0));
        assert_eq!(r.var(), Ok(u64::MAX));
        assert_eq!(r.opt(), Ok(None));
        assert_eq!(r.opt(), Ok(Some(300)));
        assert_eq!(r.bytes(), Ok(&b"abc"[..]));
        assert_eq!(r.finish(), Ok(()));
        assert_eq!(
            Reader::new(&[0x80; 11]).var(),
            Err(WireError("varint too long"))
        );
        assert_eq!(
            Reader::new(&[5, 1]).bytes(),
            Err(WireError("truncated bytes"))
        );
    }
}
