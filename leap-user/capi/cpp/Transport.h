// Transport.h: the abstract transport of the original LEAP engine, as its
// sources are built against it, with leap underneath (libleap).
//
// A drop-in: the same namespace, classes, control types, constructors and
// virtual methods as the original's Transport.h, so that an engine built
// against the original headers builds against these by swapping the files
// (Transport.h, TcpTransport.h/.cpp, UdpTransport.h/.cpp,
// KernelTransport.h/.cpp, plus LeapLink.h, which the .cpp files include)
// and linking libleap (`pkg-config --cflags --libs leap`). Errors are
// thrown as std::runtime_error, as in the original.
//
// One addition the engine does not see: set_packet_size() (non-virtual, as
// in the original) also calls the protected virtual packet_size_changed(),
// so that a concrete transport learns its frame length: the engine calls
// initialize() before set_packet_size(8 + dim * 4), and leap's TCP reads
// frames of exactly that length.

#ifndef LEAP_TRANSPORT_H
#define LEAP_TRANSPORT_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace Inference {
    // Control message types (layer re-assignment).
    enum class ControlMessageType : uint8_t {
        RESIZE_LAYERS = 1, // one worker takes split_layer..end_layer
        RESIZE_CHAIN = 2,  // every worker takes ranges[worker_index]
        ACK = 3            // the answer travelling back to the head
    };

    // Workers a RESIZE_CHAIN message describes at most.
    constexpr int MAX_WORKERS = 16;

    // Layers of one worker (packed, as on the wire).
    struct LayerRange {
        int32_t start_layer;
        int32_t end_layer;
        uint8_t is_tail;
    } __attribute__((packed));

    // A control message, host byte order, packed: 162 bytes.
    struct ControlMessage {
        ControlMessageType type;
        int32_t split_layer;   // RESIZE_LAYERS (and an ACK): first layer
        int32_t end_layer;     // RESIZE_LAYERS (and an ACK): end layer
        uint8_t is_tail;       // RESIZE_LAYERS (and an ACK)
        int32_t worker_index;  // RESIZE_CHAIN: the worker that reads it
        int32_t total_workers; // RESIZE_CHAIN: workers in ranges
        LayerRange ranges[MAX_WORKERS];
    } __attribute__((packed));

    // The first two bytes of a control frame (host byte order).
    constexpr uint16_t CONTROL_MAGIC = 0xC0DE;

    // A control frame's start: the marker, then the message (164 bytes).
    struct ControlPacketHeader {
        uint16_t magic;
        ControlMessage msg;
    } __attribute__((packed));

    static_assert(sizeof(LayerRange) == 9, "LayerRange is 9 bytes on the wire");
    static_assert(sizeof(ControlMessage) == 162, "ControlMessage is 162 bytes on the wire");
    static_assert(sizeof(ControlPacketHeader) == 164, "a control frame starts with 164 bytes");

    class Transport {
    protected:
        // Bytes of a data packet (8-byte header + dim floats); 0 until set.
        size_t packet_size_ = 0;

        // leap: called by set_packet_size() with the new size. The leap
        // transports set their frame length here (may throw
        // std::runtime_error when the transport cannot take frames that
        // long).
        virtual void packet_size_changed(size_t size) { (void) size; }

    public:
        virtual ~Transport() = default;

        // The packet size: control messages are padded to it.
        void set_packet_size(size_t size) {
            packet_size_ = size;
            packet_size_changed(size);
        }

        size_t get_packet_size() const { return packet_size_; }

        // Binds, listens and connects.
        virtual void initialize() = 0;

        virtual void send(const void *data, size_t size) = 0;

        virtual void recv(void *data, size_t size) = 0;

        virtual void send_next(const void *data, const size_t size) { send(data, size); }
        virtual void recv_next(void *data, const size_t size) { recv(data, size); }
        virtual void send_prev(const void *data, const size_t size) { send(data, size); }
        virtual void recv_prev(void *data, const size_t size) { recv(data, size); }

        // A header and a payload as one frame (by default merged, then
        // send_next).
        virtual void send_multipart_next(const void *header, const size_t header_size, const void *data,
                                         const size_t data_size) {
            std::vector<char> frame(header_size + data_size);
            if (header_size > 0) std::memcpy(frame.data(), header, header_size);
            if (data_size > 0) std::memcpy(frame.data() + header_size, data, data_size);
            send_next(frame.data(), frame.size());
        }

        // The marker and the message, padded with zeros to packet_size_
        // when that holds them, sent with send_next.
        virtual void send_control(const ControlMessage &msg) {
            ControlPacketHeader pkt{CONTROL_MAGIC, msg};
            if (packet_size_ >= sizeof(pkt)) {
                std::vector<char> frame(packet_size_, 0);
                std::memcpy(frame.data(), &pkt, sizeof(pkt));
                send_next(frame.data(), frame.size());
            } else {
                send_next(&pkt, sizeof(pkt));
            }
        }

        // A control message that has arrived, without waiting: true when
        // one was taken into msg.
        virtual bool recv_control_nonblocking(ControlMessage &msg) {
            (void) msg;
            return false;
        }
    };
} // namespace Inference

#endif // LEAP_TRANSPORT_H
