"""The rpm rebuild's pure parts: rpm's query sections read back, rpm -V read, the generated spec."""

from __future__ import annotations

import pytest

from agent.guard.dnf.rpm_rebuild import SECTION, SEP, parse_query, parse_verify, render_spec


def _query(files: str, requires: str = "") -> str:
    header = SEP.join(["libnvidia-compute", "3", "580.95.05", "1.el9", "x86_64", "NVIDIA", "NVIDIA compute 100%"])
    provides = f"libnvidia-compute{SEP}={SEP}3:580.95.05-1.el9\nlibcuda.so.1()(64bit){SEP}{SEP}\n"
    scripts = [f"<lua>{SEP}-- ldconfig", f"(none){SEP}(none)", f"(none){SEP}(none)", f"/bin/sh{SEP}ldconfig",
               f"(none){SEP}(none)", f"(none){SEP}(none)"]
    return SECTION.join([header, "line one\nline two", requires, provides, "", "", *scripts, files])


def test_the_query_sections_are_read_back() -> None:
    """Header, dependencies (rpmlib() and the self-provide dropped), scriptlets with interpreters, files."""
    files = (f"/etc/OpenCL/vendors/nvidia.icd{SEP}0100644{SEP}root{SEP}root{SEP}cn{SEP}\n"
             f"/usr/lib64/libcuda.so.1{SEP}0120777{SEP}root{SEP}root{SEP}{SEP}libcuda.so.580.95.05\n")
    requires = f"rpmlib(PayloadIsXz){SEP}<={SEP}5.2-1\nlibc.so.6()(64bit){SEP}{SEP}\n"
    header = parse_query(_query(files, requires))
    assert (header.name, header.epoch, header.version, header.release) == ("libnvidia-compute", "3", "580.95.05",
                                                                           "1.el9")
    assert header.description == "line one\nline two"
    assert header.dependencies == (("Requires", "libc.so.6()(64bit)"), ("Provides", "libcuda.so.1()(64bit)"))
    assert header.scriptlets == (("pre", "<lua>", "-- ldconfig"), ("postun", "/bin/sh", "ldconfig"))
    assert [(f.path, f.mode, f.flags, f.link_to) for f in header.files] == [
        ("/etc/OpenCL/vendors/nvidia.icd", 0o100644, "cn", ""),
        ("/usr/lib64/libcuda.so.1", 0o120777, "", "libcuda.so.580.95.05")]


def test_a_truncated_answer_is_refused() -> None:
    """Fewer sections than asked for is an error, never a package with half its metadata."""
    with pytest.raises(ValueError, match="sections"):
        parse_query("libnvidia-compute")


def test_rpm_verify_separates_changed_missing_and_edited_config() -> None:
    """Content changes (S, 5, L) of plain files are changes, of %config files edits; mode or mtime alone are not."""
    text = ("S.5....T.    /usr/lib64/libcuda.so.580.95.05\n"
            "S.5....T.  c /etc/OpenCL/vendors/nvidia.icd\n"
            ".M.......    /usr/bin/nvidia-smi\n"
            "missing     /usr/share/doc/x/README\n")
    assert parse_verify(text) == (["/usr/lib64/libcuda.so.580.95.05"], ["/usr/share/doc/x/README"],
                                  ["/etc/OpenCL/vendors/nvidia.icd"])


def test_the_spec_keeps_epoch_modes_owners_config_and_escapes_macros() -> None:
    """Epoch, no generated dependencies, %config(noreplace), %attr with the header's mode and owner, a quoted
    path, and every % of the metadata and scriptlets escaped so rpmbuild expands nothing."""
    files = (f"/etc/OpenCL/vendors/nvidia.icd{SEP}0100644{SEP}root{SEP}video{SEP}cn{SEP}\n"
             f"/usr/lib64/dir with space{SEP}040755{SEP}root{SEP}root{SEP}{SEP}\n")
    header = parse_query(_query(files))
    spec = render_spec(header, header.files)
    assert "Epoch: 3\n" in spec and "AutoReqProv: no\n" in spec and "Summary: NVIDIA compute 100%%\n" in spec
    assert '%config(noreplace) %attr(0644,root,video) "/etc/OpenCL/vendors/nvidia.icd"' in spec
    assert '%dir %attr(0755,root,root) "/usr/lib64/dir with space"' in spec
    assert "%pre -p <lua>\n-- ldconfig\n" in spec and "%postun -p /bin/sh\nldconfig\n" in spec
