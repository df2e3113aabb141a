"""A load balancer's files on disk, stamped without being read: any change shows."""

import os

import pytest

from lbagent.haproxy.errors import HaproxyError
from lbagent.haproxy.files import HaproxyPaths, disk_stamp, write_tree


def test_the_stamp_changes_with_the_configuration_and_the_files_and_only_then(tmp_path):
    paths = HaproxyPaths(tmp_path)
    paths.make_dirs()
    absent = disk_stamp(paths, "lb-1")
    paths.lb_file("lb-1").write_text("frontend a\n")
    written = disk_stamp(paths, "lb-1")
    assert written != absent and disk_stamp(paths, "lb-1") == written

    replacement = paths.conf_dir / "lb-1.cfg.new"
    replacement.write_text("frontend a\n")  # the same text, in a new file renamed over the old
    os.rename(replacement, paths.lb_file("lb-1"))
    renamed = disk_stamp(paths, "lb-1")
    assert renamed != written

    write_tree(paths.lb_files_dir("lb-1"), {"tls/cert.pem": b"one"})
    with_files = disk_stamp(paths, "lb-1")
    assert with_files != renamed
    (paths.lb_files_dir("lb-1") / "tls" / "cert.pem").write_bytes(b"two, longer")
    assert disk_stamp(paths, "lb-1") != with_files
    assert disk_stamp(paths, "lb-2") == absent  # another load balancer's stamp is its own


def test_an_id_that_is_no_file_name_is_refused(tmp_path):
    with pytest.raises(HaproxyError):
        disk_stamp(HaproxyPaths(tmp_path), "../escape")


def test_a_configuration_replaced_by_a_symlink_is_stamped_through_it(tmp_path):
    """A pass reads through a symlink: an edit of what it points to must show too."""
    paths = HaproxyPaths(tmp_path)
    paths.make_dirs()
    target = tmp_path / "elsewhere.cfg"
    target.write_text("frontend a\n")
    paths.lb_file("lb-1").symlink_to(target)
    linked = disk_stamp(paths, "lb-1")
    target.write_text("frontend a\n# and more\n")
    assert disk_stamp(paths, "lb-1") != linked
    target.unlink()
    assert disk_stamp(paths, "lb-1").endswith(b"-> absent")
