//! The chart module draws what it is given: every series with all its points, lanes with
//! the first on top, bars side by side (a zero as a stub, hatched ones striped), spans and
//! event ticks; a legend naming each label once; axes with titles and round ticks; and a
//! caption wrapped without losing a word. Text is written as `<text>`: no font is read.

mod common;

use allowance_sim::chart::{
    axis_ticks, time_ticks, Bar, Chart, Colour, Panel, Series, Span, Swatch, XAxis,
};
use common::svg::{all_text, elements, in_colour, texts};

fn drawn(chart: &Chart) -> String {
    let svg = chart.svg().expect("drawn");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    svg
}

fn over_time(end_ms: u64, panel: Panel) -> String {
    drawn(&Chart::new(XAxis::time(end_ms)).panel(panel))
}

fn with(series: Vec<Series>) -> Panel {
    let mut panel = Panel::values("requests per second").title("a panel");
    for s in series {
        panel.push(s);
    }
    panel
}

#[test]
fn a_line_is_one_polyline_through_every_point() {
    let points: Vec<(f64, f64)> = (0..50)
        .map(|i| (i as f64 * 100.0, (i % 7) as f64))
        .collect();
    let svg = over_time(
        5_000,
        with(vec![Series::line("rate", Colour::BLUE, points)]),
    );
    let lines = in_colour(&svg, "polyline", Colour::BLUE);
    // The legend's swatch (drawn first, at the top), then the series.
    assert_eq!(lines.len(), 2, "{svg}");
    assert_eq!(lines[0].points().len(), 2);
    let drawn = lines[1].points();
    assert_eq!(drawn.len(), 50);
    // Left to right, in order.
    assert!(drawn.windows(2).all(|w| w[0].0 < w[1].0));
}

#[test]
fn steps_turn_at_each_change_and_run_to_the_end() {
    let steps = Series::steps(
        "limit",
        Colour::DARK_GREY,
        vec![(0.0, 4.0), (1_000.0, 2.0), (3_000.0, 6.0)],
        4_000.0,
    );
    let svg = over_time(8_000, with(vec![steps]));
    // After the legend's swatch.
    let line = &in_colour(&svg, "polyline", Colour::DARK_GREY)[1];
    let p = line.points();
    assert_eq!(p.len(), 6, "{p:?}");
    // Level, then a vertical turn at the change.
    assert_eq!(p[0].1, p[1].1);
    assert_eq!(p[1].0, p[2].0);
    assert_eq!(p[3].0, p[4].0);
    // Held to `until`, half of the 8 s axis.
    let (left, right) = (p[0].0, p[5].0);
    assert!(left < right && p[4].1 == p[5].1);
    let axis_right = left + 2.0 * (right - left);
    assert!((axis_right - (860.0 - 30.0)).abs() <= 1.0, "{axis_right}");
}

#[test]
fn values_above_the_axis_are_drawn_at_its_top_and_the_note_says_so() {
    let line = Series::line("rate", Colour::BLUE, vec![(0.0, 200.0), (1_000.0, 10.0)]);
    let panel = with(vec![line])
        .y_max(10.0)
        .note("above the axis at first", Colour::BLUE);
    let svg = over_time(1_000, panel);
    let p = in_colour(&svg, "polyline", Colour::BLUE)[1].points();
    // 200 is drawn where 10, the axis's top, is.
    assert_eq!(p[0].1, p[1].1);
    let ticks = texts(&svg);
    assert!(ticks.iter().any(|t| t == "10") && !ticks.iter().any(|t| t == "12"));
    assert!(ticks.iter().any(|t| t == "above the axis at first"));
}

#[test]
fn lanes_put_the_first_on_top_with_dots_crosses_and_spans_in_their_lane() {
    let mut panel = Panel::lanes((0..3).map(|i| format!("worker {i}")).collect()).title("run");
    panel.push(Series::spans(
        "told to wait",
        Colour::AMBER,
        vec![
            Span::in_lane(0.0, 1_000.0, 2),
            Span::in_lane(500.0, 800.0, 0),
        ],
    ));
    panel.push(Series::dots(
        "429",
        Colour::RED,
        vec![(0.0, 0.0), (0.0, 2.0), (1_000.0, 2.0)],
    ));
    panel.push(Series::crosses(
        "abandoned",
        Colour::BLACK,
        vec![(2_000.0, 1.0)],
    ));
    let svg = over_time(2_000, panel);
    for lane in ["worker 0", "worker 1", "worker 2"] {
        assert!(texts(&svg).iter().any(|t| t == lane), "{lane}");
    }
    // The legend's dot, then three.
    let dots = in_colour(&svg, "circle", Colour::RED);
    assert_eq!(dots.len(), 1 + 3);
    let (lane0, lane2) = (dots[1].num("cy"), dots[2].num("cy"));
    assert!(lane0 < lane2, "the first lane is on top");
    assert_eq!(lane2, dots[3].num("cy"));
    // The legend's block, then each span a lane high (18 px), around its lane's dots.
    let spans = in_colour(&svg, "rect", Colour::AMBER);
    assert_eq!(spans.len(), 1 + 2);
    let (top, height) = (spans[1].num("y"), spans[1].num("height"));
    assert!((17.0..=19.0).contains(&height), "{height}");
    assert!(top < lane2 && lane2 < top + height);
    assert!(spans[2].num("width") < spans[1].num("width"));
    assert!(spans[2].num("y") < top);
    // A cross is two strokes, in its lane and the legend.
    assert_eq!(in_colour(&svg, "line", Colour::BLACK).len(), 2 * 2);
}

#[test]
fn spans_without_a_lane_shade_the_whole_panel_and_ticks_mark_events() {
    let panel = with(vec![
        Series::line("rate", Colour::BLUE, vec![(0.0, 1.0), (10_000.0, 1.0)]),
        Series::spans("cooldown", Colour::AMBER, vec![Span::new(2_000.0, 4_000.0)]),
        Series::ticks("a 429", Colour::RED, vec![2_000.0, 2_100.0, 9_000.0]),
    ]);
    let svg = over_time(10_000, panel);
    // After the legend's block: the whole 150 px of the plot.
    let span = &in_colour(&svg, "rect", Colour::AMBER)[1];
    assert!((149.0..=151.0).contains(&span.num("height")), "{span:?}");
    // The legend's tick, then three at the foot, 10 px high, in order.
    let ticks = in_colour(&svg, "polyline", Colour::RED);
    assert_eq!(ticks.len(), 1 + 3);
    let foot = ticks[1].points();
    assert_eq!(foot[0].0, foot[1].0);
    assert!((foot[0].1 - foot[1].1 - 10.0).abs() <= 1.0, "{foot:?}");
    assert!(foot[0].1 > span.num("y") + 140.0, "at the foot");
    assert!(ticks[1].points()[0].0 < ticks[2].points()[0].0);
}

#[test]
fn bars_stand_side_by_side_a_zero_is_a_stub_and_hatched_bars_are_striped() {
    let labels = vec!["a\nfirst".to_owned(), "b\nsecond".to_owned()];
    let x = XAxis::categories(labels, "cell");
    let bar = |category, value, hatched| Bar {
        category,
        value,
        hatched,
    };
    let mut panel = Panel::values("attempts / job").title("attempts");
    panel.push(Series::bars(
        "naive",
        Colour::RED,
        vec![bar(0, 3.0, false), bar(1, 0.5, true)],
    ));
    panel.push(Series::bars(
        "shared",
        Colour::GREEN,
        vec![bar(0, 1.0, false), bar(1, 0.0, false)],
    ));
    panel.push(Series::level("ideal", 1.0));
    let chart = Chart::new(x)
        .panel(panel)
        .legend_entry(Swatch::Hatched(Colour::RED), "jobs abandoned");
    let svg = drawn(&chart);
    // The legend's block and hatched swatch, the solid bar, the hatched one: pale and striped.
    let naive = in_colour(&svg, "rect", Colour::RED);
    assert_eq!(naive.len(), 2 + 2, "{naive:?}");
    assert_eq!(naive[2].get("opacity"), Some("1"));
    assert_eq!(naive[3].get("opacity"), Some("0.3"));
    let stripes = in_colour(&svg, "polyline", Colour::RED);
    assert!(stripes.len() >= 4, "{stripes:?}");
    // Side by side in each group: shared right of naive.
    let shared = in_colour(&svg, "rect", Colour::GREEN);
    assert_eq!(shared.len(), 1 + 2);
    assert!(naive[2].num("x") < shared[1].num("x"));
    assert!(shared[1].num("x") < naive[3].num("x"));
    // 3 is three times as tall as 1, and the zero is a visible stub.
    let ratio = naive[2].num("height") / shared[1].num("height");
    assert!((ratio - 3.0).abs() < 0.1, "{ratio}");
    assert!((1.0..=3.0).contains(&shared[2].num("height")));
    // The group labels once, line by line, then the axis title; the level labelled on its line.
    let text = texts(&svg);
    assert!(!text.iter().any(String::is_empty), "{text:?}");
    for t in ["a", "first", "b", "second", "cell", "ideal"] {
        assert_eq!(
            text.iter().filter(|x| *x == t).count(),
            1,
            "{t} in {text:?}"
        );
    }
    // The legend: the series, then the extra entry; the level is not in it.
    let legend: Vec<&str> = chart.legend().into_iter().map(|(_, l)| l).collect();
    assert_eq!(legend, ["naive", "shared", "jobs abandoned"]);
}

#[test]
fn the_legend_names_each_label_once_across_panels() {
    let panel = |title: &str| {
        with(vec![
            Series::line("adaptive", Colour::BLUE, vec![(0.0, 1.0)]),
            Series::ticks("a 429", Colour::RED, Vec::new()),
        ])
        .title(title)
    };
    let chart = Chart::new(XAxis::time(1_000))
        .title("two runs")
        .panel(panel("first"))
        .panel(panel("second"));
    let svg = drawn(&chart);
    let text = texts(&svg);
    for once in ["two runs", "first", "second", "adaptive", "a 429"] {
        assert_eq!(text.iter().filter(|t| *t == once).count(), 1, "{once}");
    }
    // Each panel has its axes' titles.
    for twice in ["requests per second", "seconds since the start"] {
        assert_eq!(text.iter().filter(|t| *t == twice).count(), 2, "{twice}");
    }
}

#[test]
fn axes_have_round_ticks_with_units() {
    let line = Series::line("share", Colour::BLUE, vec![(0.0, 30.0), (2_500.0, 70.0)]);
    let panel = with(vec![line]).y_max(100.0).y_unit("%");
    let svg = over_time(2_500, panel);
    let text = texts(&svg);
    for tick in ["0%", "20%", "100%", "0", "0.5", "2.5"] {
        assert!(text.iter().any(|t| t == tick), "{tick} in {text:?}");
    }
    assert_eq!(time_ticks(2_500), [0, 500, 1_000, 1_500, 2_000, 2_500]);
    assert_eq!(time_ticks(110_000).get(1), Some(&10_000));
    // However long the run, a dozen ticks or so, on round minutes.
    for hours in [1, 2, 10, 1_000] {
        let ticks = time_ticks(hours * 3_600_000);
        assert!((6..=13).contains(&ticks.len()), "{hours} h: {ticks:?}");
        assert!(
            ticks.iter().all(|t| t % 300_000 == 0),
            "{hours} h: {ticks:?}"
        );
    }
    // Text is text: no font is embedded or read.
    assert!(!elements(&svg, "text").is_empty());
    assert!(!svg.contains("<image") && !svg.contains("@font-face"));
}

#[test]
fn ticks_are_round_and_cover_the_data() {
    for (max, want) in [
        (9.79, (10.0, 2.0)),
        (5.0, (5.0, 1.0)),
        (1.0, (1.0, 0.2)),
        (1.02, (1.2, 0.2)),
        (0.37, (0.4, 0.1)),
        (120.0, (120.0, 20.0)),
    ] {
        assert_eq!(axis_ticks(max), want, "{max}");
    }
    // Degenerate input still gives an axis.
    assert_eq!(axis_ticks(0.0), (1.0, 0.2));
    assert_eq!(axis_ticks(f64::NAN), (1.0, 0.2));
}

#[test]
fn the_caption_is_wrapped_without_losing_a_word() {
    let long = "one two three four five six seven eight nine ten ".repeat(30);
    let chart = Chart::new(XAxis::time(1_000))
        .panel(with(Vec::new()))
        .caption(vec![
            long.trim().to_owned(),
            "A second paragraph.".to_owned(),
        ]);
    let svg = drawn(&chart);
    let lines: Vec<String> = texts(&svg)
        .into_iter()
        .filter(|t| t.split(' ').count() > 2)
        .collect();
    assert!(lines.len() >= 4, "{lines:?}");
    assert!(all_text(&svg).contains(&format!("{} A second paragraph.", long.trim())));
    // Wrapped to the chart: every line shorter than 860 px at ~6.5 px per character.
    assert!(lines.iter().all(|l| l.chars().count() <= 130));
}
