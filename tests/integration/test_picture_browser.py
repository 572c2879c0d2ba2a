"""The picture and the report as a real browser shows them (headless chromium): not blank, each
GPU card drawn where the layout model put it, in its role's colour; the report printed: laid out
for paper it fits the page (no node column or GPU card cut or overlapping), in PDF it keeps its
colours and starts each host on a new page; and docs/ct200.svg, the README's picture, is what
the command line draws now."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.host import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.picture import assignments, inventory_svg, render_report
from proxgpu.picture.layout import lay_out, svg_id
from proxgpu.picture.report import plan_report
from proxgpu.picture.shapes import Rect
from proxgpu.planning import SplitPolicy, plan_split
from tests.support.browser import Chromium, screenshot
from tests.support.factories import ct200, eight_by_eight
from tests.support.pdf import read_pdf
from tests.support.png import decode_png
from tests.support.trees import EXAMPLES, REPO

HOSTS = {"ct200": ct200, "8x8": eight_by_eight}
POLICY = SplitPolicy(lxc=200, vms=[(300, None)])
#: At most 16 hostpciN entries per VM: the 56 vfio GPUs of 8x8 go to seven VMs, one per node.
POLICIES = {"ct200": POLICY, "8x8": SplitPolicy(lxc=200, vms=[(301 + i, 8) for i in range(7)])}
#: The fills of a GPU card staying on the host driver and of one going to vfio-pci
#: (templates/picture.css.j2).
HOST_FILL = (0xE6, 0xF4, 0xEA)
VFIO_FILL = (0xE3, 0xEE, 0xFC)
WHITE = (255, 255, 255)
#: The report's backgrounds of an added diff line and of a warning (templates/report.html.j2).
ADDED_FILL = (0xE6, 0xFF, 0xEC)
WARNING_FILL = (0xFF, 0xF8, 0xE1)
#: What a page leaves for content with the report's 12 mm margins, in CSS pixels (96 per inch):
#: the width of A4 (the narrower) and the height of Letter (the shorter).
PX_PER_MM = 96 / 25.4
PAGE_WIDTH = int((210 - 24) * PX_PER_MM)
PAGE_HEIGHT = int((279.4 - 24) * PX_PER_MM)
#: A printed column may be scaled down to fit a page, but its 12px text stays over 9px.
READABLE_SCALE = 0.75
#: Where each node column and each GPU card of a report went, as the browser laid it out.
MEASURE = """[...document.querySelectorAll('.pg-columns > svg')].map(svg => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
  const gpus = [...svg.querySelectorAll('rect[id^="gpu-"]')].map(e => [e.id, ...box(e)]);
  return {column: box(svg), drawn: svg.viewBox.baseVal.width, gpus: gpus};
})"""
#: The pictures of a page whose text reaches out of them: [picture's box, text, text's box].
CUT_TEXT = """[...document.querySelectorAll('svg')].flatMap(svg => {
  const outer = svg.getBoundingClientRect();
  return [...svg.querySelectorAll('text')].map(t => [t.textContent, t.getBoundingClientRect()])
    .filter(([_, r]) => r.left < outer.left || r.right > outer.right + 0.5
                        || r.top < outer.top || r.bottom > outer.bottom + 0.5)
    .map(([text, r]) => [[outer.left, outer.right], text, [r.left, r.right]]);
})"""


def _plannable(inventory: Inventory, policy: SplitPolicy) -> Inventory:
    """The inventory with the guests the plan gives GPUs to, on a Proxmox VE with devN entries."""
    configs = {f"/etc/pve/qemu-server/{vmid}.conf": "cores: 8\n" for vmid, _ in policy.vms}
    configs["/etc/pve/lxc/200.conf"] = "cores: 8\n"
    return replace(inventory, pve_version="8.4.1", guest_configs=configs)


def _near(pixel: tuple[int, int, int], colour: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 3 for a, b in zip(pixel, colour, strict=True))


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_each_gpu_card_is_drawn_where_the_layout_puts_it_in_its_roles_colour(
    name: str, tmp_path: Path
) -> None:
    inventory: Inventory = HOSTS[name]()
    roles = assignments(plan_split(inventory, POLICIES[name]))
    picture = lay_out(inventory, roles)
    page = tmp_path / f"{name}.svg"
    page.write_text(inventory_svg(inventory, roles))
    width, height = int(picture.width) + 1, int(picture.height) + 1
    image = decode_png(screenshot(page, tmp_path / f"{name}.png", width, height))
    for gpu in inventory.gpus:
        box = picture.gpu_boxes[svg_id("gpu", gpu.address)]
        # The card's bottom-right corner area holds no text: only the card's fill.
        pixel = image.pixels[int(box.bottom) - 6][int(box.right) - 12]
        expected = HOST_FILL if roles[gpu.address].role == "host" else VFIO_FILL
        assert _near(pixel, expected), (gpu.address, pixel)


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_the_report_renders_and_is_not_blank(name: str, tmp_path: Path) -> None:
    policy = POLICIES[name]
    section = plan_report(_plannable(HOSTS[name](), policy), policy)
    assert section.plan is not None, section.refusals or section.error
    html = tmp_path / f"{name}.html"
    html.write_text(render_report([section], generated="test"))
    image = decode_png(screenshot(html, tmp_path / f"{name}.png", 1200, 1600))
    colours = image.colours()
    total = image.width * image.height
    assert colours[WHITE] < 0.9 * total
    assert len(colours) > 50  # text, cards, frames: not a flat page
    host = sum(n for colour, n in colours.items() if _near(colour, HOST_FILL))
    vfio = sum(n for colour, n in colours.items() if _near(colour, VFIO_FILL))
    assert host > 2000 and vfio > 2000


def _report(tmp_path: Path, *names: str) -> Path:
    sections = []
    for name in names:
        section = plan_report(_plannable(HOSTS[name](), POLICIES[name]), POLICIES[name])
        assert section.plan is not None, section.refusals or section.error
        sections.append(section)
    html = tmp_path / f"{'+'.join(names)}.html"
    html.write_text(render_report(sections, generated="test"))
    return html


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_the_report_laid_out_for_paper_fits_the_page(name: str, tmp_path: Path) -> None:
    html = _report(tmp_path, name)
    with Chromium(tmp_path) as browser:
        browser.open(html, PAGE_WIDTH, PAGE_HEIGHT, media="print")
        columns = browser.evaluate(MEASURE)
        page_width = browser.evaluate("document.documentElement.scrollWidth")
        cut = browser.evaluate(CUT_TEXT)
    assert page_width <= PAGE_WIDTH  # no table, diff line or picture wider than the paper
    assert not cut  # every title, label and legend stays inside its picture
    assert len(columns) == len(HOSTS[name]().numa_nodes)
    cards = []
    for column in columns:
        x, y, width, height = column["column"]
        assert x >= 0 and x + width <= PAGE_WIDTH, column["column"]
        assert height <= PAGE_HEIGHT, column["column"]  # a page holds the whole node
        assert width / column["drawn"] >= READABLE_SCALE
        outline = Rect(x, y, width, height, "column")
        for gpu, *card in column["gpus"]:
            rect = Rect(card[0], card[1], card[2], card[3], "gpu", id=gpu)
            assert outline.contains(rect), (gpu, card, column["column"])
            cards.append(rect)
    assert len(cards) == len(HOSTS[name]().gpus)
    overlapping = [
        (a.id, b.id) for i, a in enumerate(cards) for b in cards[i + 1 :] if a.overlaps(b)
    ]
    assert not overlapping


def test_no_text_reaches_out_of_the_picture_of_any_example(tmp_path: Path) -> None:
    with Chromium(tmp_path) as browser:
        for host in ("ct200", "h200-vm", "shared-iommu-group", "single-socket", "uneven-5-3"):
            svg = tmp_path / f"{host}.svg"
            svg.write_text(inventory_svg(inspect(DirectoryHost(str(EXAMPLES / host)))))
            browser.open(svg, 1500, 1000)
            assert not browser.evaluate(CUT_TEXT), host


def _pdf_colour(colour: tuple[int, int, int]) -> tuple[float, float, float]:
    red, green, blue = (round(channel / 255, 4) for channel in colour)
    return red, green, blue


#: The fewest runs of text a printed page of the report shows.
MIN_TEXT_RUNS = 30


def test_the_printed_report_keeps_its_colours_and_gives_each_host_its_own_pages(
    tmp_path: Path,
) -> None:
    pages = {}
    with Chromium(tmp_path) as browser:
        for names in (("ct200",), ("8x8",), ("8x8", "ct200")):
            browser.open(_report(tmp_path, *names), 1200, 900)
            document = read_pdf(browser.print_pdf())
            assert {size for size in document.pages} == {(612.0, 792.0)}  # Letter
            pages[names] = len(document.pages)
            for colour in (HOST_FILL, VFIO_FILL, ADDED_FILL, WARNING_FILL):
                assert _pdf_colour(colour) in document.fills, (names, colour)
            # No page is left nearly blank (a title and a heading show about 20 runs of text;
            # the change's facts fill the first page, the diff runs on across pages).
            assert min(document.texts) >= MIN_TEXT_RUNS, (names, document.texts)
    assert 2 <= pages[("ct200",)] <= 9 and pages[("8x8",)] > pages[("ct200",)]
    # The second host starts on a page of its own, not below the end of the first.
    assert pages[("8x8", "ct200")] == pages[("8x8",)] + pages[("ct200",)]


def test_a_refused_plans_report_still_renders_the_host(tmp_path: Path) -> None:
    html = tmp_path / "refused.html"
    # CT 200 asks for five GPUs on one node, which holds four: the planner refuses (exit 9).
    argv = ["report", "--root", str(EXAMPLES / "ct200"), "--lxc", "200:5", "--vm", "300"]
    code = main([*argv, "-o", str(html)])
    assert code == 9
    image = decode_png(screenshot(html, tmp_path / "refused.png", 1000, 1600))
    assert image.colours()[WHITE] < 0.95 * image.width * image.height


def test_the_readme_picture_is_current(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ct200.svg"
    assert (
        main(["inspect", "--root", str(EXAMPLES / "ct200"), "--format", "svg", "-o", str(out)]) == 0
    )
    assert out.read_text() == (REPO / "docs" / "ct200.svg").read_text(), (
        "docs/ct200.svg is out of date: proxgpu inspect --root examples/hosts/ct200 "
        "--format svg -o docs/ct200.svg"
    )
