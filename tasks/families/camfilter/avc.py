"""H.264 parameter sets for a smart cut: read the source's ``avcC``, add the re-encoded head's own.

A smart cut joins frames encoded here (libx264) to packets copied from the camera's stream. Both
halves are H.264 of the same size and pixel format, but their sequence and picture parameter sets
(SPS/PPS) differ, and an MP4 or Matroska track has one ``avcC`` record. So the head is encoded
with parameter-set ids the source does not use (x264's ``sps-id``), and the clip's ``avcC`` holds
both: the source's sets, then the head's. Every slice names its PPS by id, so the head's frames
find theirs and the copied packets find the camera's, unchanged (their bytes are the source's).
Each half starts with an IDR picture, which is where a decoder may switch sets.
"""

from __future__ import annotations

from dataclasses import dataclass

NAL_IDR, NAL_SPS, NAL_PPS = 5, 7, 8


@dataclass(frozen=True)
class AvcConfig:
    """An ``AVCDecoderConfigurationRecord`` (ISO/IEC 14496-15), split into its parts.
    ``tail``: the bytes after the PPS list (the High profiles' chroma and bit-depth fields), kept as is."""

    profile: int
    compatibility: int
    level: int
    length_size: int
    sps: tuple[bytes, ...]
    pps: tuple[bytes, ...]
    tail: bytes

    @classmethod
    def parse(cls, data: bytes) -> AvcConfig:
        """ValueError if ``data`` is not an avcC record (Annex B extradata, say, starts with 0 0 0 1)."""
        if len(data) < 7 or data[0] != 1:
            raise ValueError("the H.264 parameter sets are not an avcC record")
        pos, sets = 6, []
        for count_mask in (0x1F, 0xFF):
            count = data[pos - 1] & count_mask
            found = []
            for _ in range(count):
                size = int.from_bytes(data[pos : pos + 2], "big")
                found.append(bytes(data[pos + 2 : pos + 2 + size]))
                pos += 2 + size
            if pos > len(data):
                raise ValueError("the avcC record is cut short")
            sets.append(tuple(found))
            pos += 1  # past the PPS count (after the SPS list); past the end after the PPS list
        return cls(data[1], data[2], data[3], (data[4] & 3) + 1, sets[0], sets[1], bytes(data[pos - 1 :]))

    def to_bytes(self) -> bytes:
        out = bytearray([1, self.profile, self.compatibility, self.level, 0xFC | (self.length_size - 1)])
        out.append(0xE0 | len(self.sps))
        for nal in self.sps:
            out += len(nal).to_bytes(2, "big") + nal
        out.append(len(self.pps))
        for nal in self.pps:
            out += len(nal).to_bytes(2, "big") + nal
        return bytes(out + self.tail)

    def ids(self) -> set[int]:
        """Every SPS and PPS id the record uses."""
        return {sps_id(nal) for nal in self.sps} | {pps_id(nal) for nal in self.pps}

    def with_sets(self, sps: list[bytes], pps: list[bytes]) -> AvcConfig:
        return AvcConfig(self.profile, self.compatibility, self.level, self.length_size,
                         self.sps + tuple(sps), self.pps + tuple(pps), self.tail)  # fmt: skip


def free_id(config: AvcConfig) -> int:
    """An id that no SPS or PPS of ``config`` uses (SPS ids go up to 31)."""
    used = config.ids()
    for candidate in range(32):
        if candidate not in used:
            return candidate
    raise ValueError("the source uses every SPS id")


def annexb_units(data: bytes) -> list[bytes]:
    """The NAL units of an Annex B byte stream (start codes 00 00 01 or 00 00 00 01)."""
    units, start, i, n = [], None, 0, len(data)
    while i + 2 < n:
        if data[i] == 0 and data[i + 1] == 0 and data[i + 2] == 1:
            if start is not None:
                units.append(data[start:i].rstrip(b"\x00"))
            i += 3
            start = i
        else:
            i += 1
    if start is not None and start < n:
        units.append(data[start:])
    return [u for u in units if u]


def length_prefixed(units: list[bytes], length_size: int) -> bytes:
    return b"".join(len(u).to_bytes(length_size, "big") + u for u in units)


def length_prefixed_units(data: bytes, length_size: int) -> list[bytes]:
    """The NAL units of an MP4/Matroska H.264 sample (each prefixed with its length)."""
    units, pos = [], 0
    while pos + length_size <= len(data):
        size = int.from_bytes(data[pos : pos + length_size], "big")
        units.append(data[pos + length_size : pos + length_size + size])
        pos += length_size + size
    return units


def nal_type(unit: bytes) -> int:
    return unit[0] & 0x1F if unit else -1


def is_idr(sample: bytes, length_size: int) -> bool:
    """Whether a sample holds an IDR slice: where a decoder starts afresh (a keyframe flag alone
    may mark an open-GOP I picture whose leading frames need the GOP before)."""
    return any(nal_type(u) == NAL_IDR for u in length_prefixed_units(sample, length_size))


def sps_id(nal: bytes) -> int:
    return _BitReader(_unescape(nal[4:12])).ue()  # after the header, profile, constraints, level


def pps_id(nal: bytes) -> int:
    return _BitReader(_unescape(nal[1:8])).ue()


def _unescape(data: bytes) -> bytes:
    """Emulation-prevention bytes (00 00 03) removed, as a parser of the fields must."""
    return data.replace(b"\x00\x00\x03", b"\x00\x00")


class _BitReader:
    def __init__(self, data: bytes) -> None:
        self.bits = "".join(f"{byte:08b}" for byte in data)
        self.pos = 0

    def ue(self) -> int:
        """One unsigned Exp-Golomb number."""
        zeros = 0
        while self.bits[self.pos] == "0":
            zeros += 1
            self.pos += 1
        value = int(self.bits[self.pos : self.pos + zeros + 1], 2) - 1
        self.pos += zeros + 1
        return value
