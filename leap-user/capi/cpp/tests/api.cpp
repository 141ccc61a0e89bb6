// api.cpp: the drop-in classes behave as the original's do where the engine
// relies on it, and as leap promises where it adds: std::runtime_error with
// the library's message on bad addresses, bad settings, calls before
// initialize(), recv_next/send_prev; no receive deadline by default (an
// idle worker waits), a configured one that raises; the frame length set
// after initialize(); recv_control_nonblocking taking a control frame
// without consuming or reordering data frames; send_control padding as the
// original; the environment's one parser. Pairs of nodes on loopback in
// one process, over udp and tcp.
//
// Prints one line per check and "N passed, 0 failed"; exits 1 at the
// first failure.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
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
    int passed = 0;

    [[noreturn]] void failed(int line, const std::string &what) {
        std::fprintf(stderr, "FAILED at line %d: %s\n", line, what.c_str());
        std::printf("%d passed, 1 failed\n", passed);
        std::exit(1);
    }

#define CHECK(cond, what)                                                                                      \
    do {                                                                                                       \
        if (!(cond)) failed(__LINE__, std::string(#cond) + ": " + (what));                                     \
        std::printf("ok %d - %s\n", ++passed, std::string(what).c_str());                                      \
    } while (0)

    // `f` throws std::runtime_error whose message contains `needle`.
#define THROWS(f, needle)                                                                                      \
    do {                                                                                                       \
        std::string msg_;                                                                                      \
        try {                                                                                                  \
            f;                                                                                                 \
        } catch (const std::runtime_error &e) {                                                                \
            msg_ = e.what();                                                                                   \
        }                                                                                                      \
        if (msg_.find(needle) == std::string::npos)                                                            \
            failed(__LINE__, std::string(#f) + " did not throw a runtime_error with \"" + (needle) +           \
                                 "\" (got \"" + msg_ + "\")");                                                 \
        std::printf("ok %d - %s throws: %s\n", ++passed, #f, msg_.c_str());                                    \
    } while (0)

    const std::string LO = "127.0.0.1";

    int free_port(int type) {
        const int fd = socket(AF_INET, type, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(a);
        bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
        getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
        close(fd);
        return ntohs(a.sin_port);
    }

    void clear_env() {
        for (const char *v: {"LEAP_UDP_PATH", "LEAP_INTERFACE", "LEAP_OPTIONS", "LEAP_CONFIG"}) unsetenv(v);
    }

    // Two nodes, each the other's next and previous, initialized (TCP: at
    // once, each waits for the other).
    std::pair<std::unique_ptr<Transport>, std::unique_ptr<Transport>> pair(const std::string &kind) {
        const int type = kind == "tcp" ? SOCK_STREAM : SOCK_DGRAM;
        const int pa = free_port(type), pb = free_port(type);
        std::unique_ptr<Transport> a, b;
        if (kind == "tcp") {
            a = std::make_unique<TcpTransport>(LO, pa, LO, pb);
            b = std::make_unique<TcpTransport>(LO, pb, LO, pa);
        } else {
            a = std::make_unique<UdpTransport>(LO, pa, LO, pb);
            b = std::make_unique<UdpTransport>(LO, pb, LO, pa);
        }
        auto other = std::async(std::launch::async, [&b] { b->initialize(); });
        a->initialize();
        other.get();
        return {std::move(a), std::move(b)};
    }

    std::vector<unsigned char> frame_of(size_t len, int seed) {
        std::vector<unsigned char> f(len);
        for (size_t i = 0; i < len; i++) f[i] = static_cast<unsigned char>(i * 7 + seed);
        return f;
    }

    ControlMessage resize_layers() {
        ControlMessage m{};
        m.type = ControlMessageType::RESIZE_LAYERS;
        m.split_layer = 8;
        m.end_layer = 32;
        m.is_tail = 1;
        return m;
    }

    // Polls recv_control_nonblocking for up to 5 s.
    bool control_within(Transport &t, ControlMessage &m) {
        const auto until = Clock::now() + std::chrono::seconds(5);
        while (Clock::now() < until) {
            if (t.recv_control_nonblocking(m)) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return false;
    }

    void errors() {
        clear_env();
        UdpTransport bad_ip("not-an-ip", 9, LO, 10);
        THROWS(bad_ip.initialize(), "is not ADDR:PORT");
        TcpTransport bad_next(LO, free_port(SOCK_STREAM), "300.1.2.3", 10);
        THROWS(bad_next.initialize(), "TcpTransport::initialize: the constructor's next address: next:");
        KernelTransport bad_kernel(9999, "somewhere", 9999);
        THROWS(bad_kernel.initialize(), "KernelTransport::initialize");
        UdpTransport port_zero(LO, 0, LO, 10);
        THROWS(port_zero.initialize(), "port 0");

        UdpTransport fresh(LO, free_port(SOCK_DGRAM), LO, 10);
        const char byte = 1;
        THROWS(fresh.send_next(&byte, 1), "not initialized: call initialize() first");
        char out[16];
        THROWS(fresh.recv_prev(out, sizeof(out)), "not initialized");
        THROWS(fresh.recv_next(out, sizeof(out)), "UdpTransport::recv_next not supported in Ring");
        THROWS(fresh.send_prev(&byte, 1), "UdpTransport::send_prev not supported in Ring");
        THROWS(bad_kernel.recv_next(out, sizeof(out)), "KernelTransport::recv_next not supported in Ring");
        THROWS(bad_kernel.send_prev(&byte, 1), "KernelTransport::send_prev not supported in Ring");
        THROWS(bad_next.recv_next(out, sizeof(out)), "TcpTransport::recv_next: not offered");
        ControlMessage m{};
        CHECK(!fresh.recv_control_nonblocking(m), "no control before initialize()");

        // The environment.
        auto opened = [](const std::string &what) {
            UdpTransport t(LO, free_port(SOCK_DGRAM), LO, free_port(SOCK_DGRAM));
            try {
                t.initialize();
            } catch (...) {
                clear_env();
                throw;
            }
            clear_env();
            (void) what;
        };
        setenv("LEAP_OPTIONS", "pigeons=3", 1);
        THROWS(opened("bad key"), "LEAP_OPTIONS entry 1: pigeons: unknown setting; the settings are: listen");
        setenv("LEAP_OPTIONS", "crc=true,inflight", 1);
        THROWS(opened("no value"), "LEAP_OPTIONS entry 2: `inflight` is not key = value");
        setenv("LEAP_OPTIONS", "inflight=65", 1);
        THROWS(opened("bad value"), "inflight: `65` is not a whole number in 1..=64");
        setenv("LEAP_UDP_PATH", "carrier-pigeon", 1);
        THROWS(opened("bad path"), "LEAP_UDP_PATH=carrier-pigeon: choose udp, xdp or xdp-ringbuf");
        setenv("LEAP_UDP_PATH", "xdp", 1);
        THROWS(opened("xdp without interface"), "interface: xdp needs the interface frames arrive on");
        setenv("LEAP_CONFIG", "/nonexistent/leap.conf", 1);
        THROWS(opened("no file"), "LEAP_CONFIG=/nonexistent/leap.conf: cannot read it");
        const std::string path = "/tmp/leap-cpp-api-" + std::to_string(getpid()) + ".conf";
        std::ofstream(path) << "# the deadline\nrecv_timeout_ms = 300\n\n[transport]\n";
        setenv("LEAP_CONFIG", path.c_str(), 1);
        THROWS(opened("section"), "line 4: `[transport]`: sections are not read");
        std::ofstream(path) << "# comments, quotes, lists\nrecv_timeout_ms = 300 # ms\ncrc = \"true\"\n"
                               "queues = [0, 1]\nreliability = 'reliable'\n";
        setenv("LEAP_CONFIG", path.c_str(), 1);
        setenv("LEAP_OPTIONS", "trains=false,vlans=[10,20]", 1);
        opened("a good file and options");
        CHECK(true, "LEAP_CONFIG with comments, quotes and a list, and LEAP_OPTIONS with a bracketed list");
        std::remove(path.c_str());
    }

    // No deadline by default: an idle receive waits (an original worker
    // between requests), and takes the frame when it comes.
    void idle_worker_waits(const std::string &kind) {
        clear_env();
        auto [a, b] = pair(kind);
        a->set_packet_size(16392);
        b->set_packet_size(16392);
        std::vector<unsigned char> got(16392);
        auto waiting = std::async(std::launch::async, [&] { b->recv_prev(got.data(), got.size()); });
        const bool still = waiting.wait_for(std::chrono::milliseconds(1500)) == std::future_status::timeout;
        CHECK(still, kind + ": an idle recv_prev still waits after 1.5 s (no deadline by default)");
        const auto f = frame_of(16392, 3);
        a->send_next(f.data(), f.size());
        CHECK(waiting.wait_for(std::chrono::seconds(5)) == std::future_status::ready, kind + ": then returns");
        waiting.get();
        CHECK(got == f, kind + ": with the frame intact");
    }

    // A configured deadline raises instead of blocking for ever.
    void deadline_raises(const std::string &kind) {
        clear_env();
        setenv("LEAP_OPTIONS", "recv_timeout_ms=300", 1);
        auto [a, b] = pair(kind);
        clear_env();
        b->set_packet_size(16392);
        std::vector<unsigned char> got(16392);
        const auto t0 = Clock::now();
        THROWS(b->recv_prev(got.data(), got.size()), "recv_prev: no frame within");
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        CHECK(ms >= 250 && ms < 3000, kind + ": after " + std::to_string(ms) + " ms (deadline 300 ms)");
        const auto f = frame_of(16392, 4);
        a->send_next(f.data(), f.size());
        b->recv_prev(got.data(), got.size());
        CHECK(got == f, kind + ": the next frame still arrives intact after a deadline");
    }

    // initialize() first, set_packet_size() after, as the engine does: the
    // frame length reaches leap (TCP reads exactly that many bytes).
    void packet_size_after_initialize(const std::string &kind) {
        clear_env();
        auto [a, b] = pair(kind);
        const size_t len = 8 + 8192 * 4; // a 70B model's frame, not the default
        a->set_packet_size(len);
        b->set_packet_size(len);
        CHECK(b->get_packet_size() == len, kind + ": get_packet_size");
        std::vector<unsigned char> got(len);
        for (int i = 0; i < 20; i++) {
            const auto f = frame_of(len, i);
            a->send_multipart_next(f.data(), 8, f.data() + 8, len - 8);
            b->recv_prev(got.data(), got.size());
            if (got != f) failed(__LINE__, kind + ": frame " + std::to_string(i) + " differs");
        }
        CHECK(true, kind + ": 20 frames of " + std::to_string(len) + " bytes after initialize(), set_packet_size()");
    }

    // recv_control_nonblocking takes control frames only: data frames stay
    // for recv_prev, in order. send_control pads as the original.
    void control_without_reordering(const std::string &kind) {
        clear_env();
        auto [a, b] = pair(kind);
        const size_t len = 16392;
        a->set_packet_size(len);
        b->set_packet_size(len);
        const auto d1 = frame_of(len, 1), d2 = frame_of(len, 2);
        const ControlMessage sent = resize_layers();
        a->send_next(d1.data(), len);
        a->send_control(sent);
        a->send_next(d2.data(), len);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ControlMessage m{};
        for (int i = 0; i < 3; i++) {
            if (b->recv_control_nonblocking(m)) failed(__LINE__, kind + ": a data frame taken as control");
        }
        CHECK(true, kind + ": recv_control_nonblocking is false while a data frame comes first (3 calls)");
        std::vector<unsigned char> got(len);
        b->recv_prev(got.data(), len);
        CHECK(got == d1, kind + ": recv_prev then returns that data frame, intact");
        CHECK(control_within(*b, m), kind + ": then the control frame is taken");
        CHECK(std::memcmp(&m, &sent, sizeof(m)) == 0, kind + ": byte for byte");
        CHECK(!b->recv_control_nonblocking(m), kind + ": the data frame after it is not taken");
        b->recv_prev(got.data(), len);
        CHECK(got == d2, kind + ": recv_prev returns it, in order");

        // Inline, as the engine checks it: marker, message, zeros.
        a->send_control(sent);
        b->recv_prev(got.data(), len);
        ControlPacketHeader h{};
        std::memcpy(&h, got.data(), sizeof(h));
        bool zeros = true;
        for (size_t i = sizeof(h); i < len; i++) zeros = zeros && got[i] == 0;
        CHECK(h.magic == CONTROL_MAGIC && std::memcmp(&h.msg, &sent, sizeof(sent)) == 0 && zeros,
              kind + ": recv_prev of a control frame: 0xC0DE, the message, zeros to the packet size");
    }

    // UDP: what the original sends without a packet size (164 bytes), and
    // a packet size beyond the largest frame the transport takes.
    void udp_lengths() {
        clear_env();
        auto [a, b] = pair("udp");
        std::vector<unsigned char> got(16392, 0xff);
        a->send_control(resize_layers());
        b->recv_prev(got.data(), got.size());
        bool tail_zero = true;
        for (size_t i = sizeof(ControlPacketHeader); i < got.size(); i++) tail_zero = tail_zero && got[i] == 0;
        CHECK(got[0] == 0xde && got[1] == 0xc0 && tail_zero,
              "udp: send_control without a packet size sends the 164 bytes alone (the rest of the buffer zeroed)");
        const auto f = frame_of(16392, 5);
        a->send_next(f.data(), f.size());
        b->recv_prev(got.data(), got.size());
        CHECK(got == f, "udp: a whole packet after it arrives intact");
        // Beyond the largest frame (LEAP_OPTIONS frame_size): refused when set.
        THROWS(b->set_packet_size(200000), "set_packet_size: frame_size: frames of 200000 bytes are beyond");
        std::vector<unsigned char> huge(200000);
        THROWS(b->recv_prev(huge.data(), huge.size()), "UdpTransport::recv_prev: frame_size: frames of 200000");
    }
} // namespace

int main() {
    try {
        errors();
        for (const char *kind: {"udp", "tcp"}) {
            idle_worker_waits(kind);
            deadline_raises(kind);
            packet_size_after_initialize(kind);
            control_without_reordering(kind);
        }
        udp_lengths();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "FAILED: unexpected exception: %s\n", e.what());
        std::printf("%d passed, 1 failed\n", passed);
        return 1;
    }
    std::printf("%d passed, 0 failed\n", passed);
    return 0;
}
