// original_api.cpp: written only against the original engine's transport
// interface (original-leap.md, "The engine's side"), the way its main.cpp
// and transformer loops use it, with nothing of leap: it must build with
// leap's drop-in headers under -Wall -Wextra -Werror -std=c++20 and link
// against libleap. Run without arguments it checks the base class's
// defaults on an engine-side subclass (no network); with
// `tcp|udp|kernel HOST PORT NEXT_HOST NEXT_PORT` it only constructs the
// class by name (initialize() is never called).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "KernelTransport.h"
#include "TcpTransport.h"
#include "Transport.h"
#include "UdpTransport.h"

using namespace Inference;

namespace {
    struct PacketHeader {
        int32_t pos;
        int32_t flags;
    };

    // The worker loop's control handling, as the engine writes it.
    bool is_control(const std::vector<char> &buf, ControlMessage &msg) {
        const auto *pkt = reinterpret_cast<const ControlPacketHeader *>(buf.data());
        if (pkt->magic != CONTROL_MAGIC) return false;
        std::memcpy(&msg, &pkt->msg, sizeof(ControlMessage));
        return true;
    }

    void worker_step(Transport &t, std::vector<char> &buf, int dim) {
        ControlMessage msg{};
        if (t.recv_control_nonblocking(msg)) {
            t.send_control(msg);
            return;
        }
        t.recv_prev(buf.data(), t.get_packet_size());
        if (is_control(buf, msg)) {
            if (msg.type == ControlMessageType::RESIZE_CHAIN) {
                const LayerRange mine = msg.ranges[msg.worker_index];
                msg.worker_index++;
                if (msg.worker_index >= msg.total_workers) {
                    ControlMessage ack{};
                    ack.type = ControlMessageType::ACK;
                    ack.split_layer = mine.start_layer;
                    ack.end_layer = mine.end_layer;
                    ack.is_tail = mine.is_tail;
                    t.send_control(ack);
                } else {
                    t.send_control(msg);
                }
            }
            return;
        }
        PacketHeader header{};
        std::memcpy(&header, buf.data(), sizeof(header));
        t.send_multipart_next(&header, sizeof(header), buf.data() + sizeof(header), dim * sizeof(float));
    }

    std::unique_ptr<Transport> make(const std::string &type, const std::string &host, int port,
                                    const std::string &next_host, int next_port) {
        std::unique_ptr<Transport> transport = nullptr;
        if (type == "tcp") {
            transport = std::make_unique<TcpTransport>(host, port, next_host, next_port);
        } else if (type == "udp") {
            transport = std::make_unique<UdpTransport>(host, port, next_host, next_port);
        } else if (type == "kernel") {
            transport = std::make_unique<KernelTransport>(port, next_host, next_port);
        }
        return transport;
    }

    // A transport of the engine's own (a test double), on the abstract class.
    class Loopback : public Transport {
    public:
        std::vector<std::vector<char>> sent;

        void initialize() override {}

        void send(const void *data, size_t size) override {
            const char *p = static_cast<const char *>(data);
            sent.emplace_back(p, p + size);
        }

        void recv(void *data, size_t size) override {
            if (sent.empty()) throw std::runtime_error("nothing to receive");
            std::memcpy(data, sent.front().data(), std::min(size, sent.front().size()));
            sent.erase(sent.begin());
        }
    };

    int defaults() {
        Loopback t;
        t.initialize();
        if (t.get_packet_size() != 0) return 1;
        ControlMessage m{};
        m.type = ControlMessageType::RESIZE_CHAIN;
        m.total_workers = 2;
        m.ranges[0] = LayerRange{8, 20, 0};
        m.ranges[1] = LayerRange{20, 32, 1};
        t.send_control(m); // no packet size: the 164 bytes alone
        t.set_packet_size(sizeof(PacketHeader) + 64 * sizeof(float));
        t.send_control(m); // padded to the packet size
        const float act[64] = {1.0f};
        const PacketHeader h{7, 1};
        t.send_multipart_next(&h, sizeof(h), act, sizeof(act));
        ControlMessage none{};
        const bool ok = t.sent.size() == 3 && t.sent[0].size() == sizeof(ControlPacketHeader) &&
                        t.sent[1].size() == t.get_packet_size() && t.sent[2].size() == t.get_packet_size() &&
                        !t.recv_control_nonblocking(none);
        std::vector<char> buf(t.get_packet_size());
        ControlMessage got{};
        t.recv_prev(buf.data(), buf.size());
        const bool first = is_control(buf, got) && std::memcmp(&got, &m, sizeof(m)) == 0;
        std::printf("original interface: base class defaults %s\n", ok && first ? "ok" : "WRONG");
        return ok && first ? 0 : 1;
    }
} // namespace

int main(int argc, char **argv) {
    if (argc < 6) return defaults();
    try {
        auto transport = make(argv[1], argv[2], std::stoi(argv[3]), argv[4], std::stoi(argv[5]));
        if (!transport) throw std::runtime_error("unknown transport");
        std::vector<char> buf(sizeof(PacketHeader) + 4096 * sizeof(float));
        if (argc > 6) {
            transport->initialize();
            transport->set_packet_size(buf.size());
            worker_step(*transport, buf, 4096);
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "[Error] %s\n", e.what());
        return 1;
    }
    return 0;
}
