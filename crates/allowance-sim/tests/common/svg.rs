//! Reading back what `allowance_sim::chart` writes (plotters' SVG backend): one element per
//! line, `<tag name="value" .../>`, and `<text ...>` with its text on the next line.

use allowance_sim::chart::Colour;

/// One element's attributes, in order.
#[derive(Debug)]
pub(crate) struct Element(Vec<(String, String)>);

impl Element {
    /// The attribute `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The attribute `name` as a number.
    pub(crate) fn num(&self, name: &str) -> f64 {
        let value = self
            .get(name)
            .unwrap_or_else(|| panic!("{name} in {self:?}"));
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} in {self:?}"))
    }

    /// Whether it is drawn in `colour` (filled or stroked).
    pub(crate) fn is(&self, colour: Colour) -> bool {
        let hex = colour.hex();
        self.get("fill") == Some(hex.as_str()) || self.get("stroke") == Some(hex.as_str())
    }

    /// A polyline's points.
    pub(crate) fn points(&self) -> Vec<(f64, f64)> {
        let points = self.get("points").unwrap_or_default();
        let point = |p: &str| {
            let (x, y) = p.split_once(',').expect("x,y");
            (x.parse().expect("x"), y.parse().expect("y"))
        };
        points.split_whitespace().map(point).collect()
    }
}

fn decode(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// Every `<tag>` element, in order.
pub(crate) fn elements(svg: &str, tag: &str) -> Vec<Element> {
    let open = format!("<{tag} ");
    svg.split(&open)
        .skip(1)
        .map(|rest| {
            let head = rest.split('>').next().unwrap_or_default();
            let mut attributes = Vec::new();
            let mut rest = head;
            while let Some((name, after)) = rest.split_once("=\"") {
                let (value, after) = after.split_once('"').expect("a closing quote");
                attributes.push((name.trim().to_owned(), decode(value)));
                rest = after;
            }
            Element(attributes)
        })
        .collect()
}

/// The `<tag>` elements drawn in `colour`.
pub(crate) fn in_colour(svg: &str, tag: &str, colour: Colour) -> Vec<Element> {
    elements(svg, tag)
        .into_iter()
        .filter(|e| e.is(colour))
        .collect()
}

/// Every `<text>` element's text, in order.
pub(crate) fn texts(svg: &str) -> Vec<String> {
    svg.split("<text ")
        .skip(1)
        .filter_map(|t| t.split_once('>'))
        .filter_map(|(_, rest)| rest.split_once("</text>"))
        .map(|(text, _)| decode(text.trim()))
        .collect()
}

/// Every text, joined by spaces (a wrapped caption reads as one).
pub(crate) fn all_text(svg: &str) -> String {
    texts(svg).join(" ")
}
