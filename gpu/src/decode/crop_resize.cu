// Crop, antialiased resize and flip for a batch of decoded images: one launch, one thread per
// output pixel, each image's geometry in its own CropItem. Output: RGB rows as TailParams says,
// uint8 NHWC by default; with the device stage's tail fused in, each byte value v becomes
// v * scale + shift per channel (one fused multiply-add in float: within one rounding of torch's
// addcmul on the stage) in float, bfloat16 or half (rounded to nearest even), channels
// interleaved (NHWC memory, also channels_last's) or in planes (NCHW).
//
// The filter is the one PIL and torchvision use for bilinear resizing: a triangle widened by
// the scale when shrinking, taps normalised to sum to one, and the horizontal pass rounded to
// 8 bits before the vertical one (as PIL does), so the resize adds only rounding to what the
// decoders differ by (IDCT and chroma upsampling; the CPU's DCT scaling where it is on).
// Compiled at run time with NVRTC (no headers needed); a test also compiles it for the host
// with a C++ compiler and runs it on the CPU against the CPU path's resize.
//
// The first thread of each image also copies the image's last bytes (at most SENTINEL) into
// its row of `sentinels`, which the host reads back with one copy to tell a place the decode
// wrote from one it left poisoned: one copy per sub-batch instead of one per image.

#define SENTINEL 8

struct CropItem {
    unsigned long long src;  // first byte of the decoded image (interleaved RGB)
    unsigned int pitch;      // bytes from one decoded row to the next
    int clamp_x0;            // the filter reads source columns clamp_x0 .. clamp_x1 - 1
    int clamp_y0;            // and rows clamp_y0 .. clamp_y1 - 1
    int clamp_x1;
    int clamp_y1;
    float origin_x;          // source coordinate of the output's left edge, from clamp_x0
    float origin_y;          // and of its top edge, from clamp_y0
    float scale_x;           // source pixels per output pixel
    float scale_y;
    int inside_x0;           // output columns inside_x0 .. inside_x1 - 1 have a source;
    int inside_y0;           // the others (past a centre crop's edge) are black
    int inside_x1;
    int inside_y1;
    int flip;                // mirror left to right
    unsigned int row;        // the image's row in the output batch
    unsigned long long sentinel;  // the decoded image's last sentinel_len bytes
    unsigned int sentinel_len;    // at most SENTINEL
};

// Element types of the output (the host's `Element`).
#define OUT_U8 0
#define OUT_F32 1
#define OUT_BF16 2
#define OUT_F16 3

struct TailParams {
    float scale[3];
    float shift[3];
    int element;  // OUT_*
    int planar;   // 1: channel planes (NCHW), 0: interleaved (NHWC)
};

__device__ __forceinline__ unsigned short to_bf16(float v) {
    // Round to nearest even (the values are finite).
    const unsigned int bits = __float_as_uint(v);
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ unsigned short to_f16(float v) {
#ifdef __CUDA_ARCH__
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#else
    // Compiled for the host (a test runs the kernel on the CPU): the compiler's half type,
    // whose conversion also rounds to nearest even.
    const _Float16 h = (_Float16)v;
    unsigned short bits;
    __builtin_memcpy(&bits, &h, sizeof bits);
    return bits;
#endif
}

// Writes channel c of output pixel (x, y) of batch row `row`, whose byte value is `v`.
__device__ __forceinline__ void store(unsigned char* out, const TailParams& tail,
                                      unsigned long long row, int out_w, int out_h, int x,
                                      int y, int c, float v) {
    const unsigned long long pixels = (unsigned long long)out_w * out_h;
    const unsigned long long pixel = (unsigned long long)y * out_w + x;
    const unsigned long long index =
        tail.planar ? (row * 3 + c) * pixels + pixel : (row * pixels + pixel) * 3 + c;
    if (tail.element == OUT_U8) {
        out[index] = (unsigned char)v;
        return;
    }
    const float value = fmaf(v, tail.scale[c], tail.shift[c]);
    if (tail.element == OUT_F32) {
        ((float*)out)[index] = value;
    } else if (tail.element == OUT_BF16) {
        ((unsigned short*)out)[index] = to_bf16(value);
    } else {
        ((unsigned short*)out)[index] = to_f16(value);
    }
}

__device__ __forceinline__ float triangle(float t) {
    t = fabsf(t);
    return t < 1.0f ? 1.0f - t : 0.0f;
}

__device__ __forceinline__ float to_byte(float v) {
    // Round half up and clamp, as PIL's fixed-point filter does.
    return fminf(fmaxf(floorf(v + 0.5f), 0.0f), 255.0f);
}

extern "C" __global__ void crop_resize_flip(const CropItem* items, unsigned char* out,
                                            int out_w, int out_h, unsigned char* sentinels,
                                            TailParams tail) {
    const CropItem item = items[blockIdx.y];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const unsigned char* last = (const unsigned char*)item.sentinel;
        unsigned char* into = sentinels + (unsigned long long)item.row * SENTINEL;
        for (unsigned int i = 0; i < item.sentinel_len && i < SENTINEL; ++i) {
            into[i] = last[i];
        }
    }
    const int pixel = blockIdx.x * blockDim.x + threadIdx.x;
    if (pixel >= out_w * out_h) {
        return;
    }
    const int y = pixel / out_w;
    const int x_out = pixel - y * out_w;
    const int x = item.flip ? out_w - 1 - x_out : x_out;
    if (x < item.inside_x0 || x >= item.inside_x1 || y < item.inside_y0 ||
        y >= item.inside_y1) {
        for (int c = 0; c < 3; ++c) {
            store(out, tail, item.row, out_w, out_h, x_out, y, c, 0.0f);
        }
        return;
    }
    const float support_x = fmaxf(item.scale_x, 1.0f);
    const float support_y = fmaxf(item.scale_y, 1.0f);
    // Positions count from the first source column and row the filter may read (clamp_x0,
    // clamp_y0): the same numbers whether the whole image or a region of it was decoded.
    const float centre_x = item.origin_x + (x + 0.5f) * item.scale_x;
    const float centre_y = item.origin_y + (y + 0.5f) * item.scale_y;
    const int x0 = max((int)floorf(centre_x - support_x + 0.5f), 0);
    const int x1 = min((int)floorf(centre_x + support_x + 0.5f), item.clamp_x1 - item.clamp_x0);
    const int y0 = max((int)floorf(centre_y - support_y + 0.5f), 0);
    const int y1 = min((int)floorf(centre_y + support_y + 0.5f), item.clamp_y1 - item.clamp_y0);

    float weight_x_sum = 0.0f;
    for (int i = x0; i < x1; ++i) {
        weight_x_sum += triangle((i - centre_x + 0.5f) / support_x);
    }
    const float inverse_x = weight_x_sum > 0.0f ? 1.0f / weight_x_sum : 0.0f;

    const unsigned char* src = (const unsigned char*)item.src +
                               (unsigned long long)item.clamp_y0 * item.pitch +
                               (unsigned long long)item.clamp_x0 * 3;
    float sum0 = 0.0f, sum1 = 0.0f, sum2 = 0.0f, weight_y_sum = 0.0f;
    for (int j = y0; j < y1; ++j) {
        const float weight_y = triangle((j - centre_y + 0.5f) / support_y);
        if (weight_y == 0.0f) {
            continue;
        }
        const unsigned char* line = src + (unsigned long long)j * item.pitch;
        float h0 = 0.0f, h1 = 0.0f, h2 = 0.0f;
        for (int i = x0; i < x1; ++i) {
            const float weight_x = triangle((i - centre_x + 0.5f) / support_x);
            const unsigned char* p = line + i * 3;
            h0 += weight_x * p[0];
            h1 += weight_x * p[1];
            h2 += weight_x * p[2];
        }
        sum0 += weight_y * to_byte(h0 * inverse_x);
        sum1 += weight_y * to_byte(h1 * inverse_x);
        sum2 += weight_y * to_byte(h2 * inverse_x);
        weight_y_sum += weight_y;
    }
    const float inverse_y = weight_y_sum > 0.0f ? 1.0f / weight_y_sum : 0.0f;
    store(out, tail, item.row, out_w, out_h, x_out, y, 0, to_byte(sum0 * inverse_y));
    store(out, tail, item.row, out_w, out_h, x_out, y, 1, to_byte(sum1 * inverse_y));
    store(out, tail, item.row, out_w, out_h, x_out, y, 2, to_byte(sum2 * inverse_y));
}
