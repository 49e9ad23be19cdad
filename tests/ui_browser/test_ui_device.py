"""The page header says which device serves and why (engine/platform/device.py), as a new user sees it."""


def test_the_header_names_the_device_and_why(page_server, browser_page):
    browser_page.goto(page_server)
    header = browser_page.locator(".lab-engine")
    header.wait_for()
    text = header.inner_text()
    # the suite's engine is loaded with device="cpu" (tests/conftest.py): the reason says it was asked for
    assert "SmolLM2-135M-Instruct · fp32 · cpu: --device cpu asked for" in text, text
