"""One party's side of an OT-based PSI (RR22 or KKRT), run by SecretFlow's ``spu`` in the PSI engine's
own environment (``securevfl psi-engine install``), never imported by the project: ``spu`` pins
``numpy<2`` and its own ``jax``, so it cannot share the project's environment (securevfl/data/otpsi.py
starts this file with the engine's Python and reads its result).

Input: one JSON argument (this party's rank and name, both parties' link addresses, the protocol, its
keys' CSV file, the output file, its TLS files). Output: the intersection's keys in the output CSV (both
parties receive it: ``broadcast_result``), and one JSON line on stdout with the counts and seconds.
The link is brpc with mutual TLS against the parties' CA (the deployment's ``securevfl certs``)."""

import json
import sys
import time


def main() -> int:
    import spu.libspu.link as link  # type: ignore[import-not-found]
    import spu.psi as psi  # type: ignore[import-not-found]

    cfg = json.loads(sys.argv[1])
    desc = link.Desc()
    desc.id = cfg["run"]
    for name, addr in cfg["parties"]:
        desc.add_party(name, addr)
    desc.recv_timeout_ms = int(cfg["timeout_s"] * 1000)
    desc.connect_retry_times = max(1, int(cfg["timeout_s"] * 2))
    desc.connect_retry_interval_ms = 500
    desc.brpc_channel_protocol = "baidu_std"
    tls = cfg.get("tls")
    if tls:
        desc.enable_ssl = True
        for opts in (desc.server_ssl_opts, desc.client_ssl_opts):
            opts.cert.certificate_path = tls["cert"]
            opts.cert.private_key_path = tls["key"]
            opts.verify.ca_file_path = tls["ca"]
            opts.verify.verify_depth = 1
    t0 = time.perf_counter()
    lctx = link.create_brpc(desc, int(cfg["rank"]))
    conf = psi.PsiExecuteConfig()
    conf.protocol_conf.protocol = psi.parse_protocol(cfg["protocol"])
    conf.protocol_conf.receiver_rank = 0
    conf.protocol_conf.broadcast_result = True  # both parties hold the intersection
    conf.input_params.type = psi.SourceType.SOURCE_TYPE_FILE_CSV
    conf.input_params.path = cfg["input"]
    conf.input_params.selected_keys = ["key"]
    conf.input_params.keys_unique = True
    conf.output_params.type = psi.SourceType.SOURCE_TYPE_FILE_CSV
    conf.output_params.path = cfg["output"]
    conf.output_params.disable_alignment = True  # the keys only, in no agreed order
    report = psi.psi_execute(conf, lctx)
    print(json.dumps({"intersection": int(report.intersection_count), "original": int(report.original_count),
                      "seconds": time.perf_counter() - t0}), flush=True)
    try:  # the result is written: a link that fails to close (the peer closed first) is no failure of the PSI
        lctx.stop_link()
    except Exception as e:  # noqa: BLE001 - the engine's own exception type
        print(f"stop_link: {e}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
