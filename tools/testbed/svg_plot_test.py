"""The SVG chart: a well-formed document with a line per series, its points
where the axes put them, and a legend."""

import unittest
import xml.etree.ElementTree as ET

from tools.testbed import svg_plot

NS = "{http://www.w3.org/2000/svg}"


class SvgPlotTest(unittest.TestCase):
    def test_a_chart_of_two_series(self):
        svg = svg_plot.line_chart(
            "One <exchange>", "workers per host", "us", [
                svg_plot.Series("flat", [(1, 300), (4, 900)], "#c00"),
                svg_plot.Series("model", [(1, 320), (4, 380)], "#00c", True)],
            xticks=[1, 2, 4])
        root = ET.fromstring(svg)  # well formed, the title escaped
        lines = root.findall(f"{NS}polyline")
        self.assertEqual(len(lines), 2)
        self.assertEqual(lines[1].get("stroke-dasharray"), "6 4")
        # Markers on the measured series only.
        self.assertEqual(len(root.findall(f"{NS}circle")), 2)
        texts = [t.text for t in root.iter(f"{NS}text")]
        self.assertIn("One <exchange>", texts)
        self.assertIn("flat", texts)
        self.assertIn("2", texts)  # an x tick
        # The y axis reaches past the largest value: 900 sits below the top.
        first, last = lines[0].get("points").split()
        y_first = float(first.split(",")[1])
        y_last = float(last.split(",")[1])
        self.assertLess(y_last, y_first)
        self.assertGreater(y_last, svg_plot.TOP)


if __name__ == "__main__":
    unittest.main()
