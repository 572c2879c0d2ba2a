"""The picture and the report as a real browser shows them (headless chromium): not blank, each
GPU card drawn where the layout model put it, in its role's colour; and docs/ct200.svg, the
README's picture, is what the command line draws now."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.inspection.inventory import Inventory
from proxgpu.picture import assignments, inventory_svg, render_report
from proxgpu.picture.layout import lay_out, svg_id
from proxgpu.picture.report import plan_report
from proxgpu.planning import SplitPolicy, plan_split
from tests.support.browser import screenshot
from tests.support.factories import ct200, eight_by_eight
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


def _plannable(inventory: Inventory, policy: SplitPolicy) -> Inventory:
    """The inventory with the guests the plan gives GPUs to, on a Proxmox VE with devN entries."""
    configs = {f"/etc/pve/qemu-server/{vmid}.conf": "cores: 8\n" for vmid, _ in policy.vms}
    configs["/etc/pve/lxc/200.conf"] = "cores: 8\n"
    return inventory.model_copy(update={"pve_version": "8.4.1", "guest_configs": configs})


def _near(pixel: tuple[int, int, int], colour: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 3 for a, b in zip(pixel, colour, strict=True))


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_each_gpu_card_is_drawn_where_the_layout_puts_it_in_its_roles_colour(
    name: str, tmp_path: Path
) -> None:
    inventory: Inventory = HOSTS[name]()
    roles = assignments(plan_split(inventory, POLICY))
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


def test_a_refused_plans_report_still_renders_the_host(tmp_path: Path) -> None:
    html = tmp_path / "refused.html"
    argv = ["report", "--root", str(EXAMPLES / "ct200"), "--lxc", "201", "--vm", "300"]
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
