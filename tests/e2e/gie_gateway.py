"""A stand-in for a GIE / llm-d gateway that DLB does not run: a data port forwarding each request to the
pool's server with the fewest in flight, and its endpoint picker's ``/metrics`` as GIE's EPP exports them.

The pool figures are measured, not set: every 0.1 s the servers' own vLLM ``/metrics`` are read and
averaged (``inference_pool_average_queue_size``, ``…_kv_cache_utilization``, ``inference_pool_ready_pods``:
the pool averages llm-d's multi-cluster hub ranks clusters by), and ``/metrics`` answers from that, as GIE's
EPP does, with the requests this gateway has in flight, its counters and its request-duration histogram
(``inference_objective_*``, each request timed here as the EPP times it). A slowed server so shows up as
the EPP would show it.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.parser import text_string_to_metric_families

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "content-length"}


class GieGateway:
    """``with GieGateway(servers) as gw``: ``gw.address`` takes requests, ``gw.metrics_address`` is the EPP's /metrics."""

    def __init__(self, servers: list[str], model: str = "dlb-emulated") -> None:
        self.servers, self.model = servers, model
        self.inflight = dict.fromkeys(servers, 0)
        self.requests = self.errors = 0
        self.duration_sum, self.duration_count = 0.0, 0
        self.lock = threading.Lock()
        self.data = ThreadingHTTPServer(("127.0.0.1", 0), self._data_handler())
        self.metrics = ThreadingHTTPServer(("127.0.0.1", 0), self._metrics_handler())
        for srv in (self.data, self.metrics):
            srv.daemon_threads = True
        self.stopping = threading.Event()
        self.pool: tuple[list[float], list[float]] = ([], [])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.data.server_port}"

    @property
    def metrics_address(self) -> str:
        return f"127.0.0.1:{self.metrics.server_port}"

    def __enter__(self) -> GieGateway:
        self.pool = self._scrape_pool()
        for target in (self.data.serve_forever, self.metrics.serve_forever, self._refresh):
            threading.Thread(target=target, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for srv in (self.data, self.metrics):
            srv.shutdown()
            srv.server_close()

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        with self.lock:
            server = min(self.servers, key=lambda s: self.inflight[s])
            self.inflight[server] += 1
            self.requests += 1
        status = 502
        started = time.monotonic()
        try:
            host, port = server.rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            status, out = resp.status, resp.read()
            return status, [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP], out
        except OSError:
            return 502, [("content-type", "text/plain")], b"gateway: upstream failed\n"
        finally:
            with self.lock:
                self.inflight[server] -= 1
                self.errors += status >= 500
                if status < 500:
                    self.duration_sum += time.monotonic() - started
                    self.duration_count += 1

    def _refresh(self) -> None:
        while not self.stopping.wait(0.1):
            self.pool = self._scrape_pool()

    def _scrape_pool(self) -> tuple[list[float], list[float]]:
        waiting, kv = [], []
        for s in self.servers:
            try:
                text = urllib.request.urlopen(f"http://{s}/metrics", timeout=2).read().decode()
            except OSError:
                continue  # not ready: not counted
            got = {f.name: sum(x.value for x in f.samples) for f in text_string_to_metric_families(text)}
            waiting.append(got.get("vllm:num_requests_waiting", 0.0))
            kv.append(got.get("vllm:kv_cache_usage_perc", got.get("vllm:gpu_cache_usage_perc", 0.0)))
        return waiting, kv

    def render(self) -> str:
        """The EPP's exposition: pool averages of the servers' vLLM metrics, and this gateway's own counts."""
        waiting, kv = self.pool
        n = len(waiting)
        with self.lock:
            running, requests, errors = sum(self.inflight.values()), self.requests, self.errors
            d_sum, d_count = self.duration_sum, self.duration_count
        pool, obj = 'name="pool"', f'model_name="{self.model}",target_model_name="{self.model}"'
        return "".join([
            "# TYPE inference_pool_average_queue_size gauge\n", f"inference_pool_average_queue_size{{{pool}}} {sum(waiting) / n if n else 0.0}\n",
            "# TYPE inference_pool_average_kv_cache_utilization gauge\n",
            f"inference_pool_average_kv_cache_utilization{{{pool}}} {sum(kv) / n if n else 0.0}\n",
            "# TYPE inference_pool_ready_pods gauge\n", f"inference_pool_ready_pods{{{pool}}} {n}\n",
            "# TYPE inference_objective_running_requests gauge\n", f"inference_objective_running_requests{{{obj}}} {running}\n",
            "# TYPE inference_objective_request_total counter\n", f"inference_objective_request_total{{{obj}}} {requests}\n",
            "# TYPE inference_objective_request_error_total counter\n", f"inference_objective_request_error_total{{{obj}}} {errors}\n",
            "# TYPE inference_objective_request_duration_seconds histogram\n",
            f'inference_objective_request_duration_seconds_bucket{{{obj},le="+Inf"}} {d_count}\n',
            f"inference_objective_request_duration_seconds_sum{{{obj}}} {d_sum}\n",
            f"inference_objective_request_duration_seconds_count{{{obj}}} {d_count}\n"])

    def _data_handler(self) -> type[BaseHTTPRequestHandler]:
        gw = self

        class Data(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _proxy(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                status, out_headers, out = gw.forward(self.command, self.path, headers, body)
                self.send_response(status)
                for k, v in out_headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _proxy

        return Data

    def _metrics_handler(self) -> type[BaseHTTPRequestHandler]:
        gw = self

        class Metrics(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                out = gw.render().encode() if self.path == "/metrics" else b""
                self.send_response(200 if out else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                try:
                    self.wfile.write(out)
                except BrokenPipeError:  # the prober gave up waiting (a loaded box): its next scrape follows
                    pass

        return Metrics
