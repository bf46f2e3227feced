"""Render assets/logo.svg into the icons the Windows and macOS bundles need (assets/specchat.ico, .icns) and a
PNG for launchers that take no SVG. Run after changing the logo; the outputs are committed.

    python packaging/make_icons.py      (needs playwright and Debian's chromium, as the browser tests do)
"""
from __future__ import annotations

import base64
import io
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SIZE = 1024


def render_svg(svg: Path, size: int) -> Image.Image:
    """Chromium draws the SVG on a transparent page; Pillow cannot rasterize SVG itself."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update"])
        page = browser.new_page(viewport={"width": size, "height": size})
        page.set_content(f'<html><body style="margin:0;background:transparent">'
                         f'<img src="data:image/svg+xml;base64,{base64.b64encode(svg.read_bytes()).decode()}" width="{size}" height="{size}">'
                         f'</body></html>')
        png = page.screenshot(omit_background=True)
        browser.close()
    return Image.open(io.BytesIO(png)).convert("RGBA")


def main() -> None:
    image = render_svg(ASSETS / "logo.svg", SIZE)
    image.resize((256, 256), Image.LANCZOS).save(ASSETS / "logo-256.png")
    image.save(ASSETS / "specchat.ico", sizes=[(16, 16), (24, 24), (32, 32), (48, 48), (64, 64), (128, 128),
                                               (256, 256)])
    image.save(ASSETS / "specchat.icns")
    for name in ("logo-256.png", "specchat.ico", "specchat.icns"):
        print(f"wrote assets/{name} ({(ASSETS / name).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
