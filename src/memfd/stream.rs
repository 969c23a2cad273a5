//! An object as a stream: `std::io::{Read, Write, Seek}` at the handle's
//! offset, which clones share as `dup`'d descriptors share their file
//! description's (`read(2)`, `write(2)`, `lseek(2)`).

use super::{Memfd, MAX_LEN};
use crate::error::Error;
use std::io::{self, Read, Seek, SeekFrom, Write};

impl Read for Memfd {
    /// Reads at the offset and advances it (`read(2)`).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Read for &Memfd {
    /// Reads at the offset and advances it (`read(2)`).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut pos = self.inner.pos.lock();
        // Clipped so that the span never passes MAX_LEN (a short read).
        let room = usize::try_from(MAX_LEN - (*pos).min(MAX_LEN)).unwrap_or(usize::MAX);
        let n = buf.len().min(room);
        let n = self.read_at(&mut buf[..n], *pos)?;
        *pos += n as u64;
        Ok(n)
    }
}

impl Write for Memfd {
    /// Writes at the offset and advances it (`write(2)`).
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        (&*self).write(data)
    }

    /// Nothing to do: writes reach the object at once (use
    /// [`Memfd::sync_all`] to write a file object back to its host file).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &Memfd {
    /// Writes at the offset and advances it (`write(2)`); `EFBIG`-like
    /// `EINVAL` past [`MAX_LEN`].
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut pos = self.inner.pos.lock();
        let n = self.write_at(data, *pos)?;
        *pos += n as u64;
        Ok(n)
    }

    /// Nothing to do (see [`Memfd`]'s `flush`).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for Memfd {
    /// Moves the offset (`lseek(2)`).
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        (&*self).seek(to)
    }
}

impl Seek for &Memfd {
    /// Moves the offset (`lseek(2)`): from the start, the current offset
    /// or the end; `EINVAL` for a result below zero or past [`MAX_LEN`],
    /// the offset unchanged then. Past the end is allowed (a write there
    /// leaves a hole of zeros).
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let mut pos = self.inner.pos.lock();
        let new = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => pos.checked_add_signed(d),
            SeekFrom::End(d) => self.len().checked_add_signed(d),
        }
        .filter(|&n| n <= MAX_LEN)
        .ok_or(Error::Inval)?;
        *pos = new;
        Ok(new)
    }
}
