// engine.cpp: the head and worker loops of the original LEAP engine, shaped
// as its sources call their transport, over leap's drop-in classes.
//
// The head resizes the ring first (a RESIZE_CHAIN for every worker, the ACK
// awaited for at most 5 s), then sends every step's frame with
// send_multipart_next(&header, 8, activations, dim * 4) and blocks in
// recv_prev(buf, packet_size) for it to come back round the ring, checking
// every byte. A worker loops: recv_control_nonblocking, recv_prev, the
// first two bytes checked for 0xC0DE (control: applied, then forwarded with
// send_control or answered with an ACK, as the original protocol says),
// else it "computes" (adds 1 to every activation, or --add X; the head
// knows how many workers add 1: --compute-workers) and sends the result on
// with send_multipart_next.
//
//   engine --role worker --transport udp --host 10.0.0.2 --port 9999
//          --next-host 10.0.0.3 --next-port 9999 --index 0 [--frames N] [--dim D]
//   engine --role head --transport udp --host 10.0.0.1 --port 9999
//          --next-host 10.0.0.2 --next-port 9999 --workers 2 [--frames N] [--dim D]
//
// --transport tcp|udp|kernel as the engine's; the path, interface and
// options come from the environment (LEAP_UDP_PATH, LEAP_INTERFACE,
// LEAP_OPTIONS, LEAP_CONFIG: see LeapLink.h). The head prints one JSON line
// with the figures `leap ring --json` reports (frames_delivered, rtt_us
// p50/p90/p99/max, round_trips_per_s); a worker prints what it relayed and
// the layers the resize gave it. Exit 0 when every frame came back intact.
//
// It also speaks the protocol of `leap bench --ring-program` (rows
// `KIND·cpp`): --kind tcp|udp|xdp|xdp-ringbuf|kmod, --listen IP:PORT,
// --next IP:PORT, --prev (unused: the original's classes take none),
// --frame-size BYTES (8 + 4 * dim), --set KEY=VALUE (into LEAP_OPTIONS),
// and --copy: as `leap ring`'s nodes, no resize round, workers pass every
// frame on unchanged (recv_prev into the engine's buffer, send_next from
// it: the engine's interface has no lending), a worker prints `ready` once
// its transport is open. In that mode the receive deadline is the
// drop-in's (none), as the engine runs.
//
// Build (in leap-user/capi/cpp): g++ -std=c++20 -O2 -I. examples/engine.cpp
//        TcpTransport.cpp UdpTransport.cpp KernelTransport.cpp
//        $(pkg-config --cflags --libs leap)

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "KernelTransport.h"
#include "TcpTransport.h"
#include "UdpTransport.h"

using namespace Inference;
using Clock = std::chrono::steady_clock;

namespace {
    // The engine's packet header.
    struct PacketHeader {
        int32_t pos;
        int32_t flags;
    };

    constexpr int32_t FLAG_NEED_REPLY = 1;
    // Layers of the model; the head keeps the first HEAD_LAYERS.
    constexpr int32_t LAYERS = 32;
    constexpr int32_t HEAD_LAYERS = 8;
    constexpr auto ACK_WAIT = std::chrono::seconds(5);

    struct Options {
        std::string role;
        std::string transport = "tcp";
        std::string host = "0.0.0.0";
        int port = 9999;
        std::string next_host;
        int next_port = 9999;
        long frames = 1000;
        size_t dim = 4096;
        int workers = 2;
        int computing = -1; // workers that add 1 (default: all)
        int index = -1;     // this worker's place among the workers
        float add = 1.0f;   // what a worker adds to every activation
        bool resize = true;
        long linger_ms = 1000;
        // --copy: frames passed on unchanged (see the top of the file).
        bool copy = false;
        std::string kind;              // --kind (the bench protocol)
        std::vector<std::string> sets; // --set KEY=VALUE
    };

    // IP:PORT (an IPv6 address in brackets) into host and port.
    void split_addr(const std::string &a, std::string &host, int &port) {
        const size_t colon = a.rfind(':');
        if (colon == std::string::npos) throw std::runtime_error("usage: " + a + " is not IP:PORT");
        host = a.substr(0, colon);
        if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
        port = std::stoi(a.substr(colon + 1));
    }

    float activation(int32_t pos, size_t i) { return static_cast<float>((pos * 31 + static_cast<int32_t>(i)) % 1024); }

    Options parse(int argc, char **argv) {
        Options o;
        for (int i = 1; i < argc; i++) {
            const std::string a = argv[i];
            if (a == "--no-resize") {
                o.resize = false;
                continue;
            }
            if (a == "--copy") {
                o.copy = true;
                o.resize = false;
                o.add = 0.0f;
                o.linger_ms = 200;
                continue;
            }
            if (i + 1 >= argc) throw std::runtime_error("usage: " + a + " needs a value");
            const std::string v = argv[++i];
            if (a == "--role") o.role = v;
            else if (a == "--transport") o.transport = v;
            else if (a == "--host") o.host = v;
            else if (a == "--port") o.port = std::stoi(v);
            else if (a == "--next-host") o.next_host = v;
            else if (a == "--next-port") o.next_port = std::stoi(v);
            else if (a == "--frames") o.frames = std::stol(v);
            else if (a == "--dim") o.dim = std::stoul(v);
            else if (a == "--workers") o.workers = std::stoi(v);
            else if (a == "--compute-workers") o.computing = std::stoi(v);
            else if (a == "--index") o.index = std::stoi(v);
            else if (a == "--linger-ms") o.linger_ms = std::stol(v);
            else if (a == "--add") o.add = std::stof(v);
            else if (a == "--kind") o.kind = v;
            else if (a == "--listen") split_addr(v, o.host, o.port);
            else if (a == "--next") split_addr(v, o.next_host, o.next_port);
            else if (a == "--prev") continue;
            else if (a == "--set") o.sets.push_back(v);
            else if (a == "--frame-size") {
                const size_t bytes = std::stoul(v);
                if (bytes < sizeof(PacketHeader) + sizeof(float) || (bytes - sizeof(PacketHeader)) % sizeof(float)) {
                    throw std::runtime_error("usage: --frame-size " + v + ": give 8 + 4 * dim bytes");
                }
                o.dim = (bytes - sizeof(PacketHeader)) / sizeof(float);
            }
            else throw std::runtime_error("usage: unknown option " + a);
        }
        if ((o.role != "head" && o.role != "worker") || o.next_host.empty() || o.frames < 1 || o.dim == 0 ||
            o.workers < 1 || o.workers > MAX_WORKERS) {
            throw std::runtime_error(
                "usage: engine --role head|worker --transport tcp|udp|kernel --host IP --port P "
                "--next-host IP --next-port P [--frames N] [--dim D] [--workers W] [--compute-workers K] "
                "[--index I] [--add X] [--no-resize] [--linger-ms MS]");
        }
        if (o.computing < 0) o.computing = o.copy ? 0 : o.workers;
        return o;
    }

    // The ACK an original worker makes: its own range, zero elsewhere.
    ControlMessage fresh_ack(const LayerRange &r) {
        ControlMessage ack{};
        ack.type = ControlMessageType::ACK;
        ack.split_layer = r.start_layer;
        ack.end_layer = r.end_layer;
        ack.is_tail = r.is_tail;
        return ack;
    }

    double percentile(const std::vector<double> &sorted, int p) {
        if (sorted.empty()) return 0.0;
        return sorted[std::min(sorted.size() - 1, sorted.size() * static_cast<size_t>(p) / 100)];
    }

    int run_head(Transport &t, const Options &o) {
        const size_t packet = t.get_packet_size();
        bool acked = !o.resize;
        ControlMessage ack{};
        if (o.resize) {
            ControlMessage m{};
            m.type = ControlMessageType::RESIZE_CHAIN;
            m.worker_index = 0;
            m.total_workers = o.workers;
            const int32_t per = (LAYERS - HEAD_LAYERS) / o.workers;
            for (int w = 0; w < o.workers; w++) {
                const int32_t start = HEAD_LAYERS + per * w;
                const int32_t end = w + 1 == o.workers ? LAYERS : start + per;
                m.ranges[w] = LayerRange{start, end, static_cast<uint8_t>(end == LAYERS)};
            }
            t.send_control(m);
            const auto until = Clock::now() + ACK_WAIT;
            while (!acked && Clock::now() < until) {
                ControlMessage got{};
                if (t.recv_control_nonblocking(got)) {
                    if (got.type == ControlMessageType::ACK) {
                        acked = true;
                        ack = got;
                    }
                    continue;
                }
                std::this_thread::sleep_for(std::chrono::microseconds(100));
            }
            if (!acked) {
                std::printf("{\"role\":\"head\",\"control_ack\":false}\n");
                std::cerr << "[Error] no ACK within 5 s" << std::endl;
                return 1;
            }
        }
        std::vector<float> act(o.dim);
        std::vector<unsigned char> back(packet);
        std::vector<double> rtt;
        rtt.reserve(static_cast<size_t>(o.frames));
        long intact = 0, corrupt = 0;
        const auto started = Clock::now();
        for (long pos = 0; pos < o.frames; pos++) {
            const PacketHeader h{static_cast<int32_t>(pos), FLAG_NEED_REPLY};
            for (size_t i = 0; i < o.dim; i++) act[i] = activation(h.pos, i);
            const auto t0 = Clock::now();
            t.send_multipart_next(&h, sizeof(h), act.data(), o.dim * sizeof(float));
            t.recv_prev(back.data(), packet);
            rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
            PacketHeader got{};
            std::memcpy(&got, back.data(), sizeof(got));
            bool ok = got.pos == h.pos && got.flags == h.flags;
            for (size_t i = 0; ok && i < o.dim; i++) {
                float v;
                std::memcpy(&v, back.data() + sizeof(h) + i * sizeof(float), sizeof(v));
                ok = v == activation(h.pos, i) + static_cast<float>(o.computing);
            }
            if (ok) {
                intact++;
            } else {
                corrupt++;
                std::cerr << "frame " << pos << " came back as pos " << got.pos << " with other bytes" << std::endl;
            }
        }
        const double secs = std::chrono::duration<double>(Clock::now() - started).count();
        std::sort(rtt.begin(), rtt.end());
        std::printf("{\"role\":\"head\",\"transport\":\"%s\",\"frame_size\":%zu,\"frames_sent\":%ld,"
                    "\"frames_delivered\":%ld,\"frames_corrupt\":%ld,\"elapsed_s\":%.6f,\"control_ack\":%s,"
                    "\"ack\":{\"split_layer\":%d,\"end_layer\":%d,\"is_tail\":%d,\"worker_index\":%d,"
                    "\"total_workers\":%d},"
                    "\"rtt_us\":{\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,\"max\":%.1f},\"round_trips_per_s\":%.0f}\n",
                    o.transport.c_str(), packet, o.frames, intact, corrupt, secs, acked ? "true" : "false",
                    static_cast<int>(ack.split_layer), static_cast<int>(ack.end_layer), static_cast<int>(ack.is_tail),
                    static_cast<int>(ack.worker_index), static_cast<int>(ack.total_workers), percentile(rtt, 50),
                    percentile(rtt, 90), percentile(rtt, 99), rtt.empty() ? 0.0 : rtt.back(),
                    secs > 0 ? static_cast<double>(o.frames) / secs : 0.0);
        return intact == o.frames ? 0 : 1;
    }

    // The worker's "layers": every activation plus `add`, in blocks of 16
    // that -O2 turns into vector instructions.
    void compute(const unsigned char *in, float *out, size_t dim, float add) {
        std::memcpy(out, in, dim * sizeof(float));
        size_t i = 0;
        for (; i + 16 <= dim; i += 16) {
            for (size_t j = 0; j < 16; j++) out[i + j] += add;
        }
        for (; i < dim; i++) out[i] += add;
    }

    struct WorkerState {
        LayerRange range{};
        long control = 0;
        int chain_index = -1; // the worker_index a RESIZE_CHAIN came with
    };

    // Inline control as the original protocol says.
    void on_control(Transport &t, ControlMessage m, WorkerState &s) {
        s.control++;
        switch (m.type) {
            case ControlMessageType::RESIZE_LAYERS:
                s.range = LayerRange{m.split_layer, m.end_layer, m.is_tail};
                t.send_control(fresh_ack(s.range));
                break;
            case ControlMessageType::RESIZE_CHAIN: {
                const int32_t idx = m.worker_index;
                s.chain_index = idx;
                if (idx >= 0 && idx < MAX_WORKERS) s.range = m.ranges[idx];
                m.worker_index = idx + 1;
                if (m.worker_index >= m.total_workers) t.send_control(fresh_ack(s.range));
                else t.send_control(m);
                break;
            }
            case ControlMessageType::ACK:
                t.send_control(m);
                break;
        }
    }

    int run_worker(Transport &t, const Options &o) {
        const size_t packet = t.get_packet_size();
        std::vector<unsigned char> buf(packet);
        std::vector<float> out(o.dim);
        WorkerState s;
        long relayed = 0;
        while (o.copy && relayed < o.frames) {
            // As `leap ring`'s workers: the frame passed on unchanged.
            t.recv_prev(buf.data(), packet);
            t.send_next(buf.data(), packet);
            relayed++;
        }
        while (relayed < o.frames) {
            ControlMessage m{};
            if (t.recv_control_nonblocking(m)) {
                on_control(t, m, s);
                continue;
            }
            t.recv_prev(buf.data(), packet);
            uint16_t magic;
            std::memcpy(&magic, buf.data(), sizeof(magic));
            if (magic == CONTROL_MAGIC) {
                std::memcpy(&m, buf.data() + sizeof(magic), sizeof(m));
                on_control(t, m, s);
                continue;
            }
            PacketHeader h{};
            std::memcpy(&h, buf.data(), sizeof(h));
            compute(buf.data() + sizeof(h), out.data(), o.dim, o.add);
            t.send_multipart_next(&h, sizeof(h), out.data(), o.dim * sizeof(float));
            relayed++;
        }
        // The library answers the next node's NACKs for the last frames
        // meanwhile (the original engine's workers never stop).
        std::this_thread::sleep_for(std::chrono::milliseconds(o.linger_ms));
        const bool index_ok = o.index < 0 || !o.resize || s.chain_index == o.index;
        std::printf("{\"role\":\"worker\",\"transport\":\"%s\",\"index\":%d,\"relayed\":%ld,\"control\":%ld,"
                    "\"chain_index\":%d,\"range\":{\"start_layer\":%d,\"end_layer\":%d,\"is_tail\":%d}}\n",
                    o.transport.c_str(), o.index, relayed, s.control, s.chain_index,
                    static_cast<int>(s.range.start_layer), static_cast<int>(s.range.end_layer),
                    static_cast<int>(s.range.is_tail));
        if (!index_ok) {
            std::cerr << "[Error] worker " << o.index << " got the range of worker " << s.chain_index << std::endl;
            return 1;
        }
        return 0;
    }
} // namespace

// The bench protocol's --kind and --set, as the drop-in reads them: the
// class and LEAP_UDP_PATH, and LEAP_OPTIONS (a list value in brackets).
static void apply_kind(Options &o) {
    if (o.kind.empty()) return;
    if (o.kind == "tcp") {
        o.transport = "tcp";
    } else if (o.kind == "udp" || o.kind == "xdp" || o.kind == "xdp-ringbuf") {
        o.transport = "udp";
        setenv("LEAP_UDP_PATH", o.kind.c_str(), 1);
    } else if (o.kind == "kmod") {
        o.transport = "kernel";
    } else {
        throw std::runtime_error("--kind " + o.kind + ": choose tcp, udp, xdp, xdp-ringbuf or kmod");
    }
    std::string opts;
    if (const char *old = std::getenv("LEAP_OPTIONS")) opts = old;
    for (const std::string &kv: o.sets) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) throw std::runtime_error("--set " + kv + ": give KEY=VALUE");
        std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
        // The engine runs without a receive deadline (the drop-in's default).
        if (o.copy && key == "recv_timeout_ms") continue;
        if (value.find(',') != std::string::npos) value = "[" + value + "]";
        opts += (opts.empty() ? "" : ",") + key + "=" + value;
    }
    setenv("LEAP_OPTIONS", opts.c_str(), 1);
}

int main(int argc, char **argv) {
    try {
        Options o = parse(argc, argv);
        apply_kind(o);
        std::unique_ptr<Transport> transport;
        if (o.transport == "tcp") {
            transport = std::make_unique<TcpTransport>(o.host, o.port, o.next_host, o.next_port);
        } else if (o.transport == "udp") {
            transport = std::make_unique<UdpTransport>(o.host, o.port, o.next_host, o.next_port);
        } else if (o.transport == "kernel") {
            transport = std::make_unique<KernelTransport>(o.port, o.next_host, o.next_port);
        } else {
            throw std::runtime_error("--transport: choose tcp, udp or kernel");
        }
        transport->initialize();
        transport->set_packet_size(sizeof(PacketHeader) + o.dim * sizeof(float));
        if (o.copy && o.role == "worker") {
            std::printf("ready\n");
            std::fflush(stdout);
        }
        return o.role == "head" ? run_head(*transport, o) : run_worker(*transport, o);
    } catch (const std::exception &e) {
        std::cerr << "[Error] " << e.what() << std::endl;
        return 1;
    }
}
