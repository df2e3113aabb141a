"""Namespace marks: a file per namespace, in a directory per agent host."""

from lbagent.ovnhost.netns import NamespaceMarks


def test_a_mark_is_written_once_and_read_back(tmp_path):
    marks = NamespaceMarks("gw-1", str(tmp_path))
    assert marks.marked() == set()
    assert marks.mark("lb-a") is True
    assert marks.mark("lb-a") is False  # already there: nothing written
    assert marks.is_marked("lb-a") and not marks.is_marked("lb-b")
    assert marks.marked() == {"lb-a"}


def test_two_hosts_never_see_each_others_marks(tmp_path):
    ours, theirs = NamespaceMarks("gw-1", str(tmp_path)), NamespaceMarks("gw-2", str(tmp_path))
    ours.mark("lb-a")
    theirs.mark("lb-b")
    assert ours.marked() == {"lb-a"} and theirs.marked() == {"lb-b"}


def test_unmark_and_remove_all(tmp_path):
    marks = NamespaceMarks("gw-1", str(tmp_path))
    marks.mark("lb-a")
    marks.mark("lb-b")
    marks.unmark("lb-a")
    marks.unmark("lb-missing")
    assert marks.marked() == {"lb-b"}
    marks.remove_all()
    assert marks.marked() == set() and not (tmp_path / "gw-1").exists()


def test_without_a_host_nothing_is_marked_or_found(tmp_path):
    marks = NamespaceMarks("", str(tmp_path))
    assert marks.mark("lb-a") is False
    assert marks.marked() == set() and not marks.is_marked("lb-a")
    assert list(tmp_path.iterdir()) == []
