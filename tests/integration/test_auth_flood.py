"""A flood of wrong /metrics basic-auth passwords against a real collector while Prometheus (a
client with the right password) keeps scraping. The right client was verified once by bcrypt and
is then answered from the verdict cache on the event loop, never queued behind the flood's bcrypt
work: every one of its scrapes succeeds, bcrypt ran for it once, and its latency is printed
(docs/security.md, "Basic-auth floods")."""

import base64
import statistics
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt

from harness import metric_value, parse_metrics, peak_rss_mib
from test_security import PasswordMetricsCollector

FLOOD_THREADS = 6
FLOOD_SECONDS = 8.0


def get(url, user, password, timeout=10):
    """(status, body, seconds) of one GET with basic auth on a new connection."""
    request = urllib.request.Request(url)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(), time.monotonic() - start
    except urllib.error.HTTPError as e:
        return e.code, "", time.monotonic() - start
    except OSError:
        return 0, "", time.monotonic() - start


class AuthFloodTest(unittest.TestCase):
    def test_verified_scraper_is_not_delayed_by_wrong_passwords(self):
        with tempfile.TemporaryDirectory(prefix="stepwatch-auth-flood-") as tmp:
            users = f"{tmp}/users"
            with open(users, "w") as f:
                # The default bcrypt cost (12), as htpasswd -B makes it.
                f.write("prometheus:" + crypt.crypt("scrape-secret",
                                                    crypt.mksalt(crypt.METHOD_BLOWFISH)) + "\n")
            with PasswordMetricsCollector(tmp, metrics_basic_auth_file=users,
                                          metrics_threads=2) as c:
                status, _, first = get(c.metrics_url, "prometheus", "scrape-secret")
                self.assertEqual(status, 200)
                stop = threading.Event()
                flood_codes = {}
                lock = threading.Lock()

                def flood(i):
                    for n in range(100000):
                        if stop.is_set():
                            return
                        code, _, _ = get(c.metrics_url, "prometheus", f"wrong-{i}-{n}")
                        with lock:
                            flood_codes[code] = flood_codes.get(code, 0) + 1

                threads = [threading.Thread(target=flood, args=(i,), daemon=True)
                           for i in range(FLOOD_THREADS)]
                for t in threads:
                    t.start()
                latencies, statuses = [], []
                deadline = time.monotonic() + FLOOD_SECONDS
                time.sleep(0.5)  # the flood's queue fills
                while time.monotonic() < deadline:
                    status, body, seconds = get(c.metrics_url, "prometheus", "scrape-secret")
                    statuses.append(status)
                    latencies.append(seconds)
                    time.sleep(0.2)
                stop.set()
                for t in threads:
                    t.join(timeout=30)
                status, body, _ = get(c.metrics_url, "prometheus", "scrape-secret")
                self.assertEqual(status, 200)
                samples = parse_metrics(body)
                checks = {r: metric_value(samples, "stepwatch_metrics_http_auth_checks_total",
                                          result=r) for r in ("cached", "verified", "refused")}
                print(f"\nscrapes under the flood: {len(latencies)}, median "
                      f"{statistics.median(latencies) * 1000:.1f} ms, max "
                      f"{max(latencies) * 1000:.1f} ms (first, uncached: {first * 1000:.0f} ms); "
                      f"flood answers {flood_codes}; auth checks {checks}; collector VmHWM "
                      f"{peak_rss_mib(c.process.proc.pid):.0f} MiB")
                self.assertEqual(statuses, [200] * len(statuses))
                self.assertGreater(len(statuses), 5)
                # Structural: bcrypt ran once for the right password, every later scrape was a
                # cached verdict, and the flood did make bcrypt work.
                self.assertEqual(checks["verified"], 1)
                self.assertGreaterEqual(checks["cached"], len(statuses))
                self.assertGreater(checks["refused"], 0)
                self.assertGreater(flood_codes.get(401, 0), 0)
                # Generous: one bcrypt alone takes ~0.25 s, a queue of them seconds.
                self.assertLess(max(latencies), 2.0)


if __name__ == "__main__":
    unittest.main()
