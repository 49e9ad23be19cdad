// The page's configuration, written once by the server into the page's <head> as JSON (ui/page.py
// `head`): the settings' names in the controls' order, the glossary, the presets, the A/B order, the
// Load tab's fields and the judge's verdicts. Frozen: a module reads it, none changes it.
function frozen(value) {
  if (value && typeof value === "object") {
    Object.values(value).forEach(frozen);
    Object.freeze(value);
  }
  return value;
}

const element = typeof document === "undefined" ? null : document.getElementById("lab-config");

export const CFG = frozen(element ? JSON.parse(element.textContent) : {});
