"""probust._progress: the work's updates reach the run's bar (scaled, never past a share), and
nothing is drawn or counted twice."""

from __future__ import annotations

from probust._progress import Share, counted_as, counting, progress, uncounted


class Recorder:
    def __init__(self) -> None:
        self.n = 0
        self.updates: list[int] = []

    def update(self, n: int = 1) -> None:
        self.n += n
        self.updates.append(n)


def test_a_share_moves_the_bar_by_at_most_its_size_and_finish_fills_the_rest():
    bar = Recorder()
    share = Share(bar, 10)
    share.add(4)
    share.add(9)  # past the share: only what is left of it
    assert bar.n == 10
    share.finish()
    assert bar.updates == [4, 6]
    other = Share(bar, 5)
    other.add(2)
    other.finish()
    assert bar.n == 15 and bar.updates[-2:] == [2, 3]


def test_inside_counting_the_works_progress_goes_to_the_share_scaled_and_draws_nothing():
    bar = Recorder()
    share = Share(bar, 100)
    with counting(share):
        # enabled=True would draw a tqdm bar outside counting; inside, it only forwards
        with progress(4, "mmse", True) as inner:
            inner.update(1)
        with counted_as(5), progress(4, "mmse", False) as inner:
            inner.update(2)
    assert bar.updates == [1, 10]


def test_a_progress_opened_inside_another_is_silent():
    bar = Recorder()
    share = Share(bar, 100)
    with counting(share), progress(10, "outer", False) as outer, progress(10, "inner", False) as inner:
        inner.update(3)  # an inner method's bar: counted by the outer one already
        outer.update(2)
    assert bar.updates == [2]


def test_a_bar_that_is_off_draws_nothing_in_or_out_of_a_run(monkeypatch):
    import tqdm.auto

    def no_bar(*args: object, **kwargs: object) -> None:
        raise AssertionError("a bar was drawn")

    monkeypatch.setattr(tqdm.auto, "tqdm", no_bar)
    for context in (counting(None), counted_as(7)):  # a run without a bar; a scale outside any run
        with context, progress(10, "mc", False) as bar:
            bar.update(3)
    with progress(10, "mc", False) as bar:
        bar.update(3)


class NotedBar(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []
        self.resumed = 0

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.notes.append(text)

    def unpause(self) -> None:
        self.resumed += 1


def test_uncounted_work_is_named_beside_the_bar_and_left_out_of_its_clock_when_long(monkeypatch):
    import probust._progress as progress_module

    bar = NotedBar()
    with counting(Share(bar, 10)):
        with uncounted("measuring rows per pass"):
            assert bar.notes == ["measuring rows per pass"]
        assert bar.notes == ["measuring rows per pass", ""] and bar.resumed == 0  # short: the clock runs on
        monkeypatch.setattr(progress_module, "_PAUSE", 0.0)
        with uncounted("measuring rows per pass"):
            pass
        assert bar.resumed == 1
    assert bar.updates == []  # nothing counted
    with uncounted("outside a run"):  # no bar: nothing happens
        pass
    assert len(bar.notes) == 4
