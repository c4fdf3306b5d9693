"""Archive extraction refuses every unsafe or oversized upload with the right HTTP status."""

from __future__ import annotations

import gzip
import io
import struct
import tarfile
import zipfile

import pytest
from registry_builders import tar_dir, tar_entries, zip_dir

from loraplex.registry.config import RegistryConfig
from loraplex.registry.archive import BadArchive, UploadTooLarge, extract_archive, save_upload

CONFIG = ("adapter_config.json", b"{}")


def tar_member(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def extract(archive, tmp_path, **limits):
    return extract_archive(archive, tmp_path / "out", RegistryConfig(**limits))


# --- accepted -----------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["", "my-adapter/", "./"])
@pytest.mark.parametrize("pack", [tar_dir, zip_dir], ids=["tar.gz", "zip"])
def test_peft_dir_at_root_or_in_one_folder(tmp_path, good_adapter, prefix, pack):
    archive = pack(good_adapter, tmp_path / "a.archive", prefix=prefix)
    peft_dir = extract(archive, tmp_path)
    assert (peft_dir / "adapter_config.json").read_bytes() == \
        (good_adapter / "adapter_config.json").read_bytes()
    assert (peft_dir / "adapter_model.safetensors").stat().st_size == \
        (good_adapter / "adapter_model.safetensors").stat().st_size


def test_format_comes_from_magic_bytes_not_name(tmp_path, good_adapter):
    archive = zip_dir(good_adapter, tmp_path / "looks-like.tgz")
    assert (extract(archive, tmp_path) / "adapter_config.json").exists()


# --- refused: unsafe entries (400) --------------------------------------------------------

@pytest.mark.parametrize("entries, problem", [
    ([("/etc/adapter_config.json", b"{}")], "absolute path"),
    ([("../adapter_config.json", b"{}")], "outside the archive"),
    ([("a/../../adapter_config.json", b"{}")], "outside the archive"),
    ([CONFIG, tar_member("adapter_model.safetensors", tarfile.SYMTYPE, "/etc/passwd")], "symlink"),
    ([CONFIG, tar_member("adapter_model.safetensors", tarfile.LNKTYPE, "adapter_config.json")],
     "hard link"),
    ([CONFIG, tar_member("dev", tarfile.CHRTYPE)], "device file"),
    ([CONFIG, tar_member("dev", tarfile.BLKTYPE)], "device file"),
    ([CONFIG, tar_member("pipe", tarfile.FIFOTYPE)], "fifo"),
    ([CONFIG, CONFIG], "appears twice"),
], ids=["absolute", "dotdot", "nested-dotdot", "symlink", "hardlink", "chardev", "blockdev",
        "fifo", "duplicate"])
def test_unsafe_tar_entries_are_refused(tmp_path, entries, problem):
    archive = tar_entries(tmp_path / "bad.tar.gz", entries)
    with pytest.raises(BadArchive, match=problem) as e:
        extract(archive, tmp_path)
    assert e.value.status == 400
    assert not (tmp_path / "etc").exists() and not (tmp_path / "adapter_config.json").exists()


@pytest.mark.parametrize("name, problem", [
    ("/abs/adapter_config.json", "absolute path"),
    ("../adapter_config.json", "outside the archive"),
    ("C:/adapter_config.json", "absolute path"),
    ("a\\..\\adapter_config.json", "backslash"),
])
def test_unsafe_zip_paths_are_refused(tmp_path, name, problem):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(zipfile.ZipInfo(name), b"{}")
    with pytest.raises(BadArchive, match=problem) as e:
        extract(archive, tmp_path)
    assert e.value.status == 400


def test_zip_symlink_is_refused(tmp_path):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(*CONFIG)
        link = zipfile.ZipInfo("adapter_model.safetensors")
        link.external_attr = 0o120777 << 16  # S_IFLNK, how zip -y stores a symlink
        zf.writestr(link, "/etc/passwd")
    with pytest.raises(BadArchive, match="symlink"):
        extract(archive, tmp_path)
    assert not (tmp_path / "out" / "adapter_model.safetensors").exists()


def test_too_many_files_is_refused(tmp_path):
    archive = tar_entries(tmp_path / "many.tar.gz", [(f"f{i}.txt", b"x") for i in range(20)])
    with pytest.raises(BadArchive, match="more than 8 entries") as e:
        extract(archive, tmp_path, max_files=8)
    assert e.value.status == 400


@pytest.mark.parametrize("data", [b"not an archive at all", b"\x1f\x8b\x08garbage", b"PK\x03\x04junk"],
                         ids=["text", "bad-gzip", "bad-zip"])
def test_garbage_is_refused(tmp_path, data):
    archive = tmp_path / "upload"
    archive.write_bytes(data)
    with pytest.raises(BadArchive) as e:
        extract(archive, tmp_path)
    assert e.value.status == 400


def test_truncated_tar_is_refused(tmp_path, good_adapter):
    data = tar_dir(good_adapter, tmp_path / "a.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(BadArchive, match="corrupt or truncated"):
        extract(tmp_path / "cut.tar.gz", tmp_path)


# --- refused: size bounds (413) -----------------------------------------------------------

def test_tar_bomb_is_refused_by_declared_size(tmp_path):
    archive = tar_entries(tmp_path / "bomb.tar.gz", [CONFIG, ("zeros.bin", bytes(8 << 20))])
    assert archive.stat().st_size < 64 << 10  # tiny upload, big expansion
    with pytest.raises(UploadTooLarge, match="decompresses to more than") as e:
        extract(archive, tmp_path, max_unpacked_bytes=1 << 20)
    assert e.value.status == 413


def test_pax_header_bomb_is_refused(tmp_path):
    """tarfile reads pax headers into memory by itself: the decompressed stream is bounded too."""
    archive = tmp_path / "pax.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("adapter_config.json")
        info.size, info.pax_headers = 2, {"comment": "x" * (8 << 20)}
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(UploadTooLarge):
        extract(archive, tmp_path, max_unpacked_bytes=1 << 20)


def test_file_and_folder_with_one_name_is_refused(tmp_path):
    archive = tar_entries(tmp_path / "clash.tar.gz", [("a", b"x"), ("a/b", b"y")])
    with pytest.raises(BadArchive, match="conflict"):
        extract(archive, tmp_path)


def test_zip_bomb_is_refused_before_writing(tmp_path):
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(4):
            zf.writestr(f"zeros{i}", bytes(1 << 20))
    with pytest.raises(UploadTooLarge) as e:
        extract(archive, tmp_path, max_unpacked_bytes=2 << 20)
    assert e.value.status == 413
    assert not any((tmp_path / "out").iterdir())


def test_actual_bytes_are_counted_even_when_headers_lie(tmp_path):
    """A tar header under-declaring its size can't happen (the size *is* the framing), but many
    small honest entries can still add up: the running count of written bytes catches it."""
    archive = tar_entries(tmp_path / "many.tar.gz", [(f"z{i}", bytes(300 << 10)) for i in range(5)])
    with pytest.raises(UploadTooLarge):
        extract(archive, tmp_path, max_unpacked_bytes=1 << 20)


def test_zip_with_lying_size_header_is_refused(tmp_path):
    archive = tmp_path / "liar.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros", bytes(4 << 20))
    data = bytearray(archive.read_bytes())
    # Patch the central directory's uncompressed size (offset 24 in its record) to 10 bytes.
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 24: cd + 28] = struct.pack("<I", 10)
    archive.write_bytes(bytes(data))
    with pytest.raises(BadArchive):  # zipfile stops at the declared size and fails the CRC
        extract(archive, tmp_path, max_unpacked_bytes=1 << 20)
    out = tmp_path / "out" / "zeros"
    assert not out.exists() or out.stat().st_size <= 10


def test_oversize_upload_file_is_413(tmp_path):
    archive = tmp_path / "big.tar.gz"
    archive.write_bytes(gzip.compress(bytes(10)) + bytes(5000))
    with pytest.raises(UploadTooLarge, match="larger than 4096 bytes") as e:
        extract(archive, tmp_path, max_upload_bytes=4096)
    assert e.value.status == 413


def test_oversize_upload_stream_stops_early(tmp_path):
    class Endless(io.RawIOBase):  # a client that never stops sending
        def readable(self):
            return True

        def readinto(self, b):
            b[:] = bytes(len(b))
            return len(b)

    with pytest.raises(UploadTooLarge) as e:
        save_upload(io.BufferedReader(Endless()), tmp_path / "upload",
                    RegistryConfig(max_upload_bytes=3 << 20))
    assert e.value.status == 413
    assert (tmp_path / "upload").stat().st_size <= 3 << 20


# --- refused: compression ratio (413), every method alike (issue 34) -------------------------

def _disk_bytes(root):
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA, zipfile.ZIP_DEFLATED])
def test_zip_bomb_of_any_method_is_refused_by_the_ratio_before_writing(tmp_path, method):
    """A few KB of bz2 (or lzma, deflate) declaring 64 MiB of zeros: under max_unpacked_bytes
    (1 GiB by default), refused by the ratio cap from its header, nothing written."""
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", method) as zf:
        zf.writestr("adapter_model.safetensors", bytes(64 << 20))
    assert archive.stat().st_size < 1 << 20
    with pytest.raises(UploadTooLarge, match=r"registry.max_compression_ratio") as e:
        extract(archive, tmp_path)
    assert e.value.status == 413
    assert _disk_bytes(tmp_path / "out") == 0


def test_zip_bomb_across_many_members_is_stopped_by_the_streaming_ratio(tmp_path):
    """Each member under the free allowance (no header check applies), together far over the
    archive's ratio: the running count stops it after about ratio_free_bytes written."""
    archive = tmp_path / "many.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_BZIP2) as zf:
        for i in range(20):
            zf.writestr(f"z{i}", bytes(3 << 20))
    with pytest.raises(UploadTooLarge, match=r"registry.max_compression_ratio"):
        extract(archive, tmp_path, ratio_free_bytes=4 << 20)
    assert _disk_bytes(tmp_path / "out") <= (4 << 20) + (1 << 20)


def test_targz_bomb_is_stopped_by_the_ratio_while_streaming(tmp_path):
    archive = tar_entries(tmp_path / "bomb.tar.gz", [("adapter_model.safetensors", bytes(64 << 20))])
    with pytest.raises(UploadTooLarge, match=r"registry.max_compression_ratio") as e:
        extract(archive, tmp_path, ratio_free_bytes=4 << 20)
    assert e.value.status == 413
    assert _disk_bytes(tmp_path / "out") <= (4 << 20) + (2 << 20)


def test_a_well_compressing_small_adapter_is_under_the_free_allowance(tmp_path, good_adapter):
    extract(tar_dir(good_adapter, tmp_path / "a.tar.gz"), tmp_path)


def test_a_cancelled_extraction_stops_at_the_next_chunk(tmp_path):
    import threading

    from loraplex.registry.archive import UploadCancelled

    archive = tar_entries(tmp_path / "big.tar.gz", [("z", bytes(8 << 20))])
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(UploadCancelled):
        extract_archive(archive, tmp_path / "out", RegistryConfig(), cancelled=cancelled)
