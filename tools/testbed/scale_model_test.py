"""The scale model: the fit recovers known costs, the check measures what
the fit did not use, and the predictions behave as the model says."""

import unittest

from tools.testbed import scale_model as sm


def agg_rows(fa, d, rtt=200, d1=0.0):
    out = []
    for h, k in ((1, 1), (1, 4), (2, 1), (2, 2), (4, 1), (4, 4)):
        t = fa.a_us + fa.host_us * h + fa.local_us * k + fa.entry_us * h * k
        out.append(sm.Measured(0, h, k, t, 0, True))
        out.append(sm.Measured(rtt, h, k, t + (d + d1 * h) * rtt, 0, True))
    return out


def rows(a, b, d, rtt=200, d1=0.0):
    out = []
    for h, k in ((1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (4, 1), (4, 2),
                 (2, 4)):
        w = h * k
        out.append(sm.Measured(0, h, k, a + b * w, 2 * (a + b * w)))
        out.append(sm.Measured(rtt, h, k, a + b * w + (d + d1 * h) * rtt, 0))
    return out


class ScaleModelTest(unittest.TestCase):
    def test_fit_recovers_the_costs(self):
        f = sm.fit(rows(60, 12, 1.3))
        self.assertAlmostEqual(f.a_us, 60)
        self.assertAlmostEqual(f.b_us, 12)
        self.assertAlmostEqual(f.d0, 1.3)
        self.assertAlmostEqual(f.d1, 0)
        checked = sm.check(rows(60, 12, 1.3), f)
        self.assertEqual(len(checked), 2)  # the delayed rows with W > 4
        for _, _, error in checked:
            self.assertAlmostEqual(error, 0)

    def test_the_links_cost_may_grow_with_the_hosts(self):
        data = rows(60, 12, 0.9, d1=0.2)
        f = sm.fit(data)
        self.assertAlmostEqual(f.d0, 0.9)
        self.assertAlmostEqual(f.d1, 0.2)
        for _, _, error in sm.check(data, f):
            self.assertAlmostEqual(error, 0)

    def test_check_reports_a_miss(self):
        data = rows(60, 12, 1.0)
        data[-1] = data[-1]._replace(p50_us=data[-1].p50_us * 2)
        errors = [e for _, _, e in sm.check(data, sm.fit(data))]
        self.assertAlmostEqual(errors[-1], -0.5)

    def test_fit_needs_two_sizes(self):
        with self.assertRaises(ValueError):
            sm.fit([sm.Measured(0, 1, 1, 50, 60)])

    def test_the_aggregated_fit_recovers_the_costs_and_checks_the_rest(self):
        fa = sm.FitAgg(90, 20, 8, 1.5)
        data = rows(60, 12, 1.3, d1=0.1) + agg_rows(fa, 1.3, d1=0.1)
        got = sm.fit_aggregated(data)
        for want, have in zip(fa, got):
            self.assertAlmostEqual(want, have)
        f = sm.fit(data)  # the flat fit ignores the aggregated rows
        self.assertAlmostEqual(f.b_us, 12)
        checked = [c for c in sm.check(data, f, got) if c[0].aggregated]
        self.assertEqual(len(checked), 6)  # every delayed aggregated row
        for _, _, error in checked:
            self.assertAlmostEqual(error, 0)
        self.assertIsNone(sm.fit_aggregated(rows(60, 12, 1.3)))

    def test_predictions(self):
        f = sm.Fit(60, 12, 1.3, 0.1)
        fa = sm.FitAgg(90, 20, 8, 1.5)
        bn_flat, bn_agg, grad_flat, grad_agg, nccl = sm.step_costs(
            f, sm.RESNET50, 1024, 128, fa=fa)
        # 106 exchanges of 60 + 12 * 1024 + 200 us (a real link: d = 1).
        self.assertAlmostEqual(bn_flat, 106 * (60 + 12 * 1024 + 200) / 1e3)
        self.assertAlmostEqual(
            bn_agg, 106 * (90 + 20 * 128 + 8 * 8 + 1.5 * 1024 + 200) / 1e3)
        self.assertLess(bn_agg, bn_flat)
        self.assertLess(grad_agg, grad_flat)
        self.assertAlmostEqual(nccl, 106 * 20 * 7 / 1e3)
        # Without aggregated measurements, no aggregated prediction.
        self.assertIsNone(sm.step_costs(f, sm.CNN, 8, 8)[1])

    def test_report_prints_the_tables(self):
        text = sm.report(rows(60, 12, 1.2))
        self.assertIn("a = 60 us, b = 12.0 us", text)
        self.assertIn("| 1024 | 128 | 8 | ", text)
        text = sm.report(rows(60, 12, 1.2) + agg_rows(sm.FitAgg(90, 20, 8, 1.5), 1.2))
        self.assertIn("a' = 90 us, h = 20.0 us per host", text)
        self.assertIn("| aggregated | 200 | 4 | 4 | 16 |", text)
        self.assertIn("| 1024 | 128 | 8 |", text)
        self.assertIn("ResNet-50 shape (53 BN layers, 25,600,000 parameters)", text)


if __name__ == "__main__":
    unittest.main()
